#include "chat_template/jinja_text.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

#include <algorithm>

namespace jambo::chat_template::text {
namespace {

// Decodes the code point at s[i] and advances i (an ill-formed sequence reads as U+FFFD).
char32_t decode(std::string_view s, size_t& i) {
  const tokenizer::unicode::DecodedChar decoded = tokenizer::unicode::decode_utf8(s, i);
  i += decoded.num_bytes;
  return decoded.code_point;
}

std::vector<char32_t> decode_all(std::string_view s) {
  std::vector<char32_t> code_points;
  for (size_t i = 0; i < s.size();) code_points.push_back(decode(s, i));
  return code_points;
}

char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  size_t i = 0;
  while (i < s.size()) {
    offsets.push_back(i);
    decode(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t code_point_count(std::string_view s) { return code_point_offsets(s).size() - 1; }

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<char32_t> removable = chars ? decode_all(*chars) : std::vector<char32_t>{};
  const auto remove = [&](char32_t c) {
    return chars ? std::find(removable.begin(), removable.end(), c) != removable.end() : is_space(c);
  };
  const std::vector<size_t> offsets = code_point_offsets(s);
  size_t begin = 0, end = offsets.size() - 1;
  const auto at = [&](size_t index) {
    size_t i = offsets[index];
    return decode(s, i);
  };
  while (left && begin < end && remove(at(begin))) ++begin;
  while (right && end > begin && remove(at(end - 1))) --end;
  return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& separator, int64_t max_split) {
  std::vector<std::string> parts;
  if (separator) {
    JAMBO_REQUIRE(!separator->empty(), "empty separator");
    size_t start = 0;
    for (size_t found; (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) &&
                       (found = s.find(*separator, start)) != std::string_view::npos;) {
      parts.emplace_back(s.substr(start, found - start));
      start = found + separator->size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  // Whitespace split: runs of whitespace separate, and leading or trailing whitespace gives no part.
  size_t i = 0;
  const auto skip_space = [&] {
    while (i < s.size()) {
      size_t next = i;
      if (!is_space(decode(s, next))) break;
      i = next;
    }
  };
  skip_space();
  while (i < s.size()) {
    if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
      parts.emplace_back(strip(s.substr(i), std::nullopt, false, true));
      return parts;
    }
    const size_t start = i;
    while (i < s.size()) {
      size_t next = i;
      if (is_space(decode(s, next))) break;
      i = next;
    }
    parts.emplace_back(s.substr(start, i - start));
    skip_space();
  }
  return parts;
}

std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count) {
  std::string out;
  int64_t done = 0;
  const auto more = [&] { return count < 0 || done < count; };
  if (old_text.empty()) {  // Python inserts new_text around every character
    const std::vector<size_t> offsets = code_point_offsets(s);
    for (size_t k = 0; k + 1 < offsets.size(); ++k) {
      if (more()) out += new_text, ++done;
      out += s.substr(offsets[k], offsets[k + 1] - offsets[k]);
    }
    if (more()) out += new_text;
    return out;
  }
  size_t start = 0;
  for (size_t found; more() && (found = s.find(old_text, start)) != std::string_view::npos; ++done) {
    out += s.substr(start, found - start);
    out += new_text;
    start = found + old_text.size();
  }
  out += s.substr(start);
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), ascii_upper);
  return out;
}

std::string lower(std::string_view s) { return tokenizer::unicode::to_lowercase(s); }

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}

std::string title(std::string_view s) {
  // jinja2 splits at runs of '-', whitespace, '(', '{', '[' and '<' and capitalizes every piece.
  const auto separator = [](char c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(static_cast<unsigned char>(c));
  };
  std::string out;
  bool word_start = true;
  for (char c : s) {
    if (separator(c)) {
      out += c;
      word_start = true;
    } else {
      out += word_start ? ascii_upper(c) : ascii_lower(c);
      word_start = false;
    }
  }
  return out;
}

std::string python_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char c : s) {
    const bool cased = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    out += cased ? (previous_cased ? ascii_lower(c) : ascii_upper(c)) : c;
    previous_cased = cased;
  }
  return out;
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const char quote = has_single && s.find('"') == std::string_view::npos ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const char32_t c = decode(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7F && c < 0xA0)) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else {
      tokenizer::unicode::append_utf8(out, c);
    }
  }
  out += quote;
  return out;
}

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t c = decode(s, i);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {  // a surrogate pair, as Python writes it
            const char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          }
        } else {
          out += s.substr(start, i - start);
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace jambo::chat_template::text
