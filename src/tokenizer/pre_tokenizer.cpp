#include "tokenizer/pre_tokenizer.h"

#include <array>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/split.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {
namespace {

// Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7F..0xA0, 0xAD)
// are mapped to U+0100 onwards in byte order.
std::array<char32_t, 256> make_byte_chars() {
  std::array<char32_t, 256> chars{};
  char32_t next_unprintable = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable =
        (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    chars[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
  }
  return chars;
}

const std::array<char32_t, 256>& byte_chars() {
  static const std::array<char32_t, 256> chars = make_byte_chars();
  return chars;
}

std::vector<TextPiece> to_pieces(std::vector<std::string> texts, bool first_at_text_start) {
  std::vector<TextPiece> pieces;
  pieces.reserve(texts.size());
  for (std::string& text : texts) {
    pieces.push_back({std::move(text), first_at_text_start && pieces.empty()});
  }
  return pieces;
}

SplitBehavior parse_behavior(const JsonField& field) {
  const std::string name = field.as_string();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  field.fail(fmt::format("unknown split behavior '{}'", name));
}

// Replaces spaces with the replacement character ("▁"), prepends one per prepend_scheme, and
// splits before each replacement character.
PreTokenizer::Step metaspace_step(const JsonField& config) {
  const std::string replacement = unicode::to_utf8(config.at("replacement").as_char());
  const PrependScheme scheme = parse_prepend_scheme(config);
  const bool split = config.bool_or("split", true);
  return [=](const TextPiece& piece) {
    std::string replaced = replace_all(piece.text, " ", replacement);
    const bool prepend = scheme == PrependScheme::kAlways ||
                         (scheme == PrependScheme::kFirst && piece.at_text_start);
    if (prepend && !replaced.empty() && !replaced.starts_with(replacement))
      replaced = replacement + replaced;
    if (!split) return std::vector<TextPiece>{{replaced, piece.at_text_start}};
    return to_pieces(split_at_matches(replaced, find_literal(replaced, replacement),
                                      SplitBehavior::kMergedWithNext, false),
                     piece.at_text_start);
  };
}

// Optionally prepends a space, splits with the GPT-2 pattern, then spells every byte as its
// byte-to-unicode character.
PreTokenizer::Step byte_level_step(const JsonField& config) {
  const bool add_prefix_space = config.bool_or("add_prefix_space", true);
  const bool use_regex = config.bool_or("use_regex", true);
  return [=](const TextPiece& piece) {
    std::string text = piece.text;
    if (add_prefix_space && !text.empty() && !text.starts_with(' ')) text = " " + text;
    std::vector<std::string> words;
    if (use_regex) {
      words = split_at_matches(text, find_gpt2_words(text), SplitBehavior::kIsolated, false);
    } else if (!text.empty()) {
      words.push_back(text);
    }
    for (std::string& word : words) {
      std::string spelled;
      for (unsigned char byte : word) unicode::append_utf8(spelled, byte_to_char(byte));
      word = std::move(spelled);
    }
    return to_pieces(std::move(words), piece.at_text_start);
  };
}

// Split on a literal string, or on the GPT-2 pattern (the only regex supported).
PreTokenizer::Step split_step(const JsonField& config) {
  const JsonField pattern = config.at("pattern");
  const auto regex = pattern.find("Regex");
  const bool is_gpt2 = regex && regex->as_string() == kGpt2Pattern;
  const std::string literal = is_gpt2 ? "" : replace_pattern_literal(pattern);
  const SplitBehavior behavior = parse_behavior(config.at("behavior"));
  const bool invert = config.bool_or("invert", false);
  return [=](const TextPiece& piece) {
    const auto matches = is_gpt2 ? find_gpt2_words(piece.text) : find_literal(piece.text, literal);
    return to_pieces(split_at_matches(piece.text, matches, behavior, invert), piece.at_text_start);
  };
}

}  // namespace

PrependScheme parse_prepend_scheme(const JsonField& config) {
  auto field = config.find("prepend_scheme");
  if (!field) {  // files written before prepend_scheme existed
    return config.bool_or("add_prefix_space", true) ? PrependScheme::kAlways
                                                    : PrependScheme::kNever;
  }
  const std::string name = field->as_string();
  if (name == "always") return PrependScheme::kAlways;
  if (name == "first") return PrependScheme::kFirst;
  if (name == "never") return PrependScheme::kNever;
  field->fail(fmt::format("unknown prepend_scheme '{}' (expected always, first or never)", name));
}

char32_t byte_to_char(unsigned char byte) { return byte_chars()[byte]; }

bool char_to_byte(char32_t c, unsigned char& byte) {
  static const auto bytes_by_char = [] {
    std::array<int, 512> bytes{};
    bytes.fill(-1);
    for (int b = 0; b < 256; ++b) bytes[byte_chars()[b]] = b;
    return bytes;
  }();
  if (c >= bytes_by_char.size() || bytes_by_char[c] < 0) return false;
  byte = static_cast<unsigned char>(bytes_by_char[c]);
  return true;
}

PreTokenizer::PreTokenizer(const JsonField& config) { add_steps(config); }

void PreTokenizer::add_steps(const JsonField& config) {
  const std::string type = config.type();
  if (type == "Sequence") {
    const JsonField pretokenizers = config.at("pretokenizers");
    for (size_t i = 0; i < pretokenizers.size(); ++i) add_steps(pretokenizers.at(i));
  } else if (type == "Metaspace") {
    steps_.push_back(metaspace_step(config));
  } else if (type == "ByteLevel") {
    steps_.push_back(byte_level_step(config));
  } else if (type == "Split") {
    steps_.push_back(split_step(config));
  } else {
    config.fail(
        fmt::format("pre_tokenizer type '{}' is not supported (supported: Sequence, "
                    "Metaspace, ByteLevel, Split)",
                    type));
  }
}

std::vector<TextPiece> PreTokenizer::pre_tokenize(std::vector<TextPiece> pieces) const {
  for (const Step& step : steps_) {
    std::vector<TextPiece> next;
    for (const TextPiece& piece : pieces) {
      for (TextPiece& out : step(piece)) {
        if (!out.text.empty()) next.push_back(std::move(out));
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace jambo::tokenizer
