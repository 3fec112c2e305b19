#include "tokenizer/normalizer.h"

#include "core/error.h"
#include "tokenizer/split.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {
namespace {

void strip_whitespace(std::string& text, bool strip_left, bool strip_right) {
  const auto chars = unicode::split_chars(text);
  size_t first = 0, last = chars.size();
  while (strip_left && first < last && unicode::is_whitespace(chars[first].code_point)) ++first;
  while (strip_right && last > first && unicode::is_whitespace(chars[last - 1].code_point)) --last;
  if (first == last) {
    text.clear();
    return;
  }
  text = text.substr(chars[first].begin, chars[last - 1].end - chars[first].begin);
}

}  // namespace

std::string replace_pattern_literal(const JsonField& pattern) {
  if (auto literal = pattern.find("String")) {
    std::string text = literal->as_string();
    if (text.empty()) literal->fail("empty pattern");
    return text;
  }
  if (auto regex = pattern.find("Regex")) {
    std::string text = regex->as_string();
    if (text.empty() || text.find_first_of(R"(\^$.|?*+()[]{})") != std::string::npos) {
      regex->fail(
          fmt::format("regex pattern '{}' is not supported (only literal patterns are)", text));
    }
    return text;
  }
  pattern.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

Normalizer::Normalizer(const JsonField& config) { add_steps(config); }

void Normalizer::add_steps(const JsonField& config) {
  const std::string type = config.type();
  if (type == "Sequence") {
    const JsonField normalizers = config.at("normalizers");
    for (size_t i = 0; i < normalizers.size(); ++i) add_steps(normalizers.at(i));
  } else if (type == "Prepend" || type == "Append") {
    const std::string affix = config.at(type == "Prepend" ? "prepend" : "append").as_string();
    const bool prepend = type == "Prepend";
    steps_.push_back([affix, prepend](std::string& text) {
      if (!text.empty()) text = prepend ? affix + text : text + affix;
    });
  } else if (type == "Replace") {
    steps_.push_back([pattern = replace_pattern_literal(config.at("pattern")),
                      content = config.at("content").as_string()](std::string& text) {
      text = replace_all(text, pattern, content);
    });
  } else if (type == "Strip") {
    const bool strip_left = config.bool_or("strip_left", true);
    const bool strip_right = config.bool_or("strip_right", true);
    steps_.push_back([=](std::string& text) { strip_whitespace(text, strip_left, strip_right); });
  } else if (type == "Lowercase") {
    steps_.push_back([](std::string& text) { text = unicode::to_lowercase(text); });
  } else {
    config.fail(
        fmt::format("normalizer type '{}' is not supported (supported: Sequence, Prepend, "
                    "Append, Replace, Strip, Lowercase)",
                    type));
  }
}

std::string Normalizer::normalize(std::string text) const {
  for (const Step& step : steps_) step(text);
  return text;
}

}  // namespace jambo::tokenizer
