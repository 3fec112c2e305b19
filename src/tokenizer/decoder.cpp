#include "tokenizer/decoder.h"

#include <charconv>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/split.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {
namespace {

const std::string kReplacement = unicode::to_utf8(unicode::kReplacementChar);

// Runs of <0xNN> tokens become their bytes when those form valid UTF-8, else one U+FFFD per token.
void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string pending_bytes;
  auto flush = [&] {
    if (pending_bytes.empty()) return;
    if (unicode::is_valid_utf8(pending_bytes)) {
      out.push_back(pending_bytes);
    } else {
      out.insert(out.end(), pending_bytes.size(), kReplacement);
    }
    pending_bytes.clear();
  };
  for (std::string& token : tokens) {
    unsigned char byte;
    if (parse_byte_token(token, byte)) {
      pending_bytes += static_cast<char>(byte);
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  tokens = std::move(out);
}

void fuse(std::vector<std::string>& tokens) {
  std::string joined;
  for (const std::string& token : tokens) joined += token;
  tokens = {joined};
}

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
void strip(std::vector<std::string>& tokens, char32_t content, size_t start, size_t stop) {
  for (std::string& token : tokens) {
    const auto chars = unicode::split_chars(token);
    size_t first = 0;
    while (first < std::min(start, chars.size()) && chars[first].code_point == content) ++first;
    size_t last = chars.size();
    while (chars.size() - last < std::min(stop, chars.size() - first) &&
           chars[last - 1].code_point == content) {
      --last;
    }
    token = first == last
                ? ""
                : token.substr(chars[first].begin, chars[last - 1].end - chars[first].begin);
  }
}

// Every replacement character becomes a space, except in the first token when a prefix space was
// prepended at encoding time (there all of them are dropped, as HF does).
void metaspace(std::vector<std::string>& tokens, char32_t replacement, bool drop_in_first_token) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string out;
    for (const unicode::CharSpan& ch : unicode::split_chars(tokens[i])) {
      if (ch.code_point != replacement) {
        out.append(tokens[i], ch.begin, ch.end - ch.begin);
      } else if (i > 0 || !drop_in_first_token) {
        out += ' ';
      }
    }
    tokens[i] = std::move(out);
  }
}

// Maps byte-level characters back to bytes (a token with any other character keeps its own
// bytes), joins everything and repairs invalid UTF-8 with U+FFFD.
void byte_level(std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    std::string token_bytes;
    bool all_mapped = true;
    for (const unicode::CharSpan& ch : unicode::split_chars(token)) {
      unsigned char byte;
      if (!char_to_byte(ch.code_point, byte)) {
        all_mapped = false;
        break;
      }
      token_bytes += static_cast<char>(byte);
    }
    bytes += all_mapped ? token_bytes : token;
  }
  tokens = {unicode::to_valid_utf8(bytes)};
}

}  // namespace

bool parse_byte_token(const std::string& token, unsigned char& byte) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return false;
  unsigned value = 0;
  const char* digits = token.data() + 3;
  auto [end, error] = std::from_chars(digits, digits + 2, value, 16);
  if (error != std::errc() || end != digits + 2) return false;
  byte = static_cast<unsigned char>(value);
  return true;
}

Decoder::Decoder(const JsonField& config) : configured_(true) { add_steps(config); }

void Decoder::add_steps(const JsonField& config) {
  const std::string type = config.type();
  if (type == "Sequence") {
    const JsonField decoders = config.at("decoders");
    for (size_t i = 0; i < decoders.size(); ++i) add_steps(decoders.at(i));
  } else if (type == "Replace") {
    steps_.push_back(
        [pattern = replace_pattern_literal(config.at("pattern")),
         content = config.at("content").as_string()](std::vector<std::string>& tokens) {
          for (std::string& token : tokens) token = replace_all(token, pattern, content);
        });
  } else if (type == "ByteFallback") {
    steps_.push_back(byte_fallback);
  } else if (type == "Fuse") {
    steps_.push_back(fuse);
  } else if (type == "Strip") {
    const char32_t content = config.at("content").as_char();
    const auto start = static_cast<size_t>(config.at("start").as_int());
    const auto stop = static_cast<size_t>(config.at("stop").as_int());
    steps_.push_back(
        [=](std::vector<std::string>& tokens) { strip(tokens, content, start, stop); });
  } else if (type == "Metaspace") {
    const char32_t replacement = config.at("replacement").as_char();
    const bool drop_in_first_token = parse_prepend_scheme(config) != PrependScheme::kNever;
    steps_.push_back([=](std::vector<std::string>& tokens) {
      metaspace(tokens, replacement, drop_in_first_token);
    });
  } else if (type == "ByteLevel") {
    steps_.push_back(byte_level);
  } else {
    config.fail(
        fmt::format("decoder type '{}' is not supported (supported: Sequence, Replace, "
                    "ByteFallback, Fuse, Strip, Metaspace, ByteLevel)",
                    type));
  }
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!configured_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i > 0 ? " " : "") + tokens[i];
    return joined;
  }
  for (const Step& step : steps_) step(tokens);
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace jambo::tokenizer
