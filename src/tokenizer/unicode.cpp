#include "tokenizer/unicode.h"

#include <algorithm>

#include "tokenizer/generated/unicode_tables.h"

namespace jambo::tokenizer::unicode {
namespace {

bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The sequence a lead byte starts: its length and the valid range of its second byte (narrower
// than 0x80..0xBF after E0, ED, F0 and F4, which excludes overlong forms and surrogates).
struct LeadByte {
  size_t num_bytes = 0;  // 0: not a valid lead byte
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
};

LeadByte classify_lead_byte(unsigned char byte) {
  if (byte < 0x80) return {1};
  if (byte >= 0xC2 && byte <= 0xDF) return {2};
  if (byte == 0xE0) return {3, 0xA0, 0xBF};
  if (byte == 0xED) return {3, 0x80, 0x9F};
  if (byte >= 0xE1 && byte <= 0xEF) return {3};
  if (byte == 0xF0) return {4, 0x90, 0xBF};
  if (byte >= 0xF1 && byte <= 0xF3) return {4};
  if (byte == 0xF4) return {4, 0x80, 0x8F};
  return {};
}

CharClass char_class(char32_t c) {
  auto it =
      std::upper_bound(kClassRanges.begin(), kClassRanges.end(), c,
                       [](char32_t value, const ClassRange& range) { return value < range.first; });
  if (it == kClassRanges.begin()) return CharClass::kOther;
  --it;
  return c <= it->last ? it->char_class : CharClass::kOther;
}

}  // namespace

DecodedChar decode_utf8(std::string_view text, size_t pos) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  const LeadByte kind = classify_lead_byte(lead);
  if (kind.num_bytes == 0) return {kReplacementChar, 1, false};
  if (kind.num_bytes == 1) return {lead, 1, true};
  char32_t code_point = lead & (0x7F >> kind.num_bytes);
  for (size_t i = 1; i < kind.num_bytes; ++i) {
    if (pos + i >= text.size()) return {kReplacementChar, i, false};
    const auto byte = static_cast<unsigned char>(text[pos + i]);
    const bool in_range =
        i == 1 ? (byte >= kind.second_min && byte <= kind.second_max) : is_continuation(byte);
    if (!in_range) return {kReplacementChar, i, false};
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  return {code_point, kind.num_bytes, true};
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string to_utf8(char32_t code_point) {
  std::string out;
  append_utf8(out, code_point);
  return out;
}

std::string to_valid_utf8(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  for (size_t pos = 0; pos < bytes.size();) {
    const DecodedChar decoded = decode_utf8(bytes, pos);
    if (!decoded.valid) {
      append_utf8(out, kReplacementChar);
    } else {
      out.append(bytes.substr(pos, decoded.num_bytes));
    }
    pos += decoded.num_bytes;
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t pos = 0; pos < bytes.size();) {
    const DecodedChar decoded = decode_utf8(bytes, pos);
    if (!decoded.valid) return false;
    pos += decoded.num_bytes;
  }
  return true;
}

std::vector<CharSpan> split_chars(std::string_view text) {
  std::vector<CharSpan> chars;
  chars.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const DecodedChar decoded = decode_utf8(text, pos);
    chars.push_back({decoded.code_point, pos, pos + decoded.num_bytes});
    pos += decoded.num_bytes;
  }
  return chars;
}

bool is_letter(char32_t c) { return char_class(c) == CharClass::kLetter; }

bool is_number(char32_t c) {
  const CharClass cls = char_class(c);
  return cls == CharClass::kDecimalNumber || cls == CharClass::kLetterNumber ||
         cls == CharClass::kOtherNumber;
}

bool is_whitespace(char32_t c) {
  return std::find(kWhiteSpace.begin(), kWhiteSpace.end(), c) != kWhiteSpace.end();
}

bool is_word_char(char32_t c) {
  constexpr char32_t kZeroWidthNonJoiner = 0x200C, kZeroWidthJoiner = 0x200D;  // Join_Control
  if (c == kZeroWidthNonJoiner || c == kZeroWidthJoiner) return true;
  switch (char_class(c)) {
    case CharClass::kOther:
    case CharClass::kOtherNumber:
      return false;
    default:
      return true;
  }
}

std::string to_lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const CharSpan& ch : split_chars(text)) {
    auto it = std::lower_bound(
        kLowercaseMappings.begin(), kLowercaseMappings.end(), ch.code_point,
        [](const LowercaseMapping& mapping, char32_t value) { return mapping.code_point < value; });
    if (it == kLowercaseMappings.end() || it->code_point != ch.code_point) {
      out.append(text.substr(ch.begin, ch.end - ch.begin));
      continue;
    }
    append_utf8(out, it->lower[0]);
    if (it->lower[1] != 0) append_utf8(out, it->lower[1]);
  }
  return out;
}

}  // namespace jambo::tokenizer::unicode
