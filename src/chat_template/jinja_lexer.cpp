#include "chat_template/jinja_lexer.h"

#include "tokenizer/unicode.h"
#include "chat_template/jinja_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>

namespace jambo::chat_template {
namespace {

bool is_space(char c) { return text::is_space(static_cast<unsigned char>(c)); }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal's body, decoded as Python's unicode-escape codec does (jinja2 uses it).
std::string unescape(std::string_view raw, size_t offset) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 == raw.size()) {
      out += raw[i];
      continue;
    }
    const char c = raw[++i];
    switch (c) {
      case '\n':
        break;
      case '\\':
      case '\'':
      case '"':
        out += c;
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        char32_t code_point = 0;
        for (size_t k = 1; k <= digits; ++k) {
          const int digit = i + k < raw.size() ? hex_value(raw[i + k]) : -1;
          if (digit < 0) throw SyntaxError(offset, fmt::format("truncated \\{} escape in a string", c));
          code_point = code_point * 16 + digit;
        }
        if (code_point > 0x10FFFF) throw SyntaxError(offset, "an escape beyond U+10FFFF in a string");
        tokenizer::unicode::append_utf8(out, code_point);
        i += digits;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          char32_t code_point = 0;
          size_t k = 0;
          for (; k < 3 && i + k < raw.size() && raw[i + k] >= '0' && raw[i + k] <= '7'; ++k)
            code_point = code_point * 8 + (raw[i + k] - '0');
          tokenizer::unicode::append_utf8(out, code_point);
          i += k - 1;
        } else {  // Python keeps unknown escapes as they are
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : source_(source) {}

  std::vector<Token> run() {
    while (pos_ < source_.size()) {
      const size_t start = find_tag(pos_);
      if (start == std::string_view::npos) {
        emit_data(source_.substr(pos_), pos_);
        break;
      }
      const char kind = source_[start + 1];
      const char modifier = start + 2 < source_.size() && (source_[start + 2] == '-' || source_[start + 2] == '+')
                                ? source_[start + 2]
                                : '\0';
      emit_data(control_left(source_.substr(pos_, start - pos_), kind, modifier), pos_);
      const size_t content = start + (modifier ? 3 : 2);
      if (kind == '#')
        lex_comment(start, content);
      else if (kind == '%' && raw_begin_end(content) != std::string_view::npos)
        lex_raw(start, raw_begin_end(content));
      else
        lex_tag(start, kind, content);
    }
    tokens_.push_back({TokenType::kEnd, "", source_.size()});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = source_.find('{', from); i != std::string_view::npos; i = source_.find('{', i + 1))
      if (i + 1 < source_.size() && (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#')) return i;
    return std::string_view::npos;
  }

  void emit_data(std::string_view text, size_t offset) {
    if (!text.empty()) tokens_.push_back({TokenType::kData, std::string(text), offset});
  }

  // Whitespace before a tag: '-' strips it all; lstrip_blocks strips the blanks between the line
  // start and a block or comment tag (not a variable tag, and not with '+').
  std::string_view control_left(std::string_view text, char kind, char modifier) const {
    if (modifier == '-') {
      while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      return text;
    }
    if (modifier == '+' || kind == '{') return text;
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    if (line_start == 0 && !line_starting_) return text;
    const std::string_view tail = text.substr(line_start);
    if (!tail.empty() && std::all_of(tail.begin(), tail.end(), is_space)) return text.substr(0, line_start);
    return text;
  }

  // Whitespace after a tag end at `end` (of `length` bytes, including a '-' or '+' marker):
  // '-' strips it all, trim_blocks (for block and comment tags) drops one newline.
  void control_right(size_t end, size_t length, bool trim_newline) {
    pos_ = end + length;
    const char marker = source_[end];
    if (marker == '-') {
      const size_t start = pos_;
      while (pos_ < source_.size() && is_space(source_[pos_])) ++pos_;
      line_starting_ = pos_ > start && source_[pos_ - 1] == '\n';
    } else if (marker != '+' && trim_newline && pos_ < source_.size() && source_[pos_] == '\n') {
      ++pos_;
      line_starting_ = true;
    } else {
      line_starting_ = false;
    }
  }

  void lex_comment(size_t start, size_t content) {
    const size_t end = source_.find("#}", content);
    if (end == std::string_view::npos) throw SyntaxError(start, "unterminated comment: '{#' without '#}'");
    const bool marked = end > content && (source_[end - 1] == '-' || source_[end - 1] == '+');
    control_right(marked ? end - 1 : end, marked ? 3 : 2, true);
  }

  // The end of "{% raw %}" when the tag at `content` is one, else npos.
  size_t raw_begin_end(size_t content) const {
    size_t i = content;
    while (i < source_.size() && is_space(source_[i])) ++i;
    if (source_.compare(i, 3, "raw") != 0 || (i + 3 < source_.size() && is_name_char(source_[i + 3])))
      return std::string_view::npos;
    i += 3;
    while (i < source_.size() && is_space(source_[i])) ++i;
    if (source_.compare(i, 3, "-%}") == 0 || source_.compare(i, 2, "%}") == 0) return i;
    return std::string_view::npos;
  }

  void lex_raw(size_t start, size_t begin_end) {
    pos_ = begin_end;
    if (source_[pos_] == '-') {
      pos_ += 3;
      while (pos_ < source_.size() && is_space(source_[pos_])) ++pos_;
    } else {
      pos_ += 2;
    }
    line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
    for (size_t tag = find_tag(pos_); tag != std::string_view::npos; tag = find_tag(tag + 1)) {
      if (source_[tag + 1] != '%') continue;
      const char modifier =
          tag + 2 < source_.size() && (source_[tag + 2] == '-' || source_[tag + 2] == '+') ? source_[tag + 2] : '\0';
      size_t i = tag + (modifier ? 3 : 2);
      while (i < source_.size() && is_space(source_[i])) ++i;
      if (source_.compare(i, 6, "endraw") != 0) continue;
      i += 6;
      while (i < source_.size() && is_space(source_[i])) ++i;
      const bool marked = i < source_.size() && (source_[i] == '-' || source_[i] == '+');
      if (source_.compare(marked ? i + 1 : i, 2, "%}") != 0) continue;
      emit_data(control_left(source_.substr(pos_, tag - pos_), '%', modifier), pos_);
      control_right(i, marked ? 3 : 2, true);
      return;
    }
    throw SyntaxError(start, "unterminated raw block: '{% raw %}' without '{% endraw %}'");
  }

  void lex_tag(size_t start, char kind, size_t content) {
    const bool block = kind == '%';
    tokens_.push_back({block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", start});
    const std::string_view end = block ? "%}" : "}}";
    std::vector<char> brackets;
    size_t i = content;
    while (true) {
      while (i < source_.size() && is_space(source_[i])) ++i;
      if (i >= source_.size())
        throw SyntaxError(start, fmt::format("unterminated tag: '{}' without '{}'", block ? "{%" : "{{", end));
      if (brackets.empty()) {
        const bool strip = source_[i] == '-' || (block && source_[i] == '+');
        if (source_.compare(strip ? i + 1 : i, 2, end) == 0) {
          tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", i});
          control_right(i, strip ? 3 : 2, block);
          return;
        }
      }
      i = lex_token(i, brackets);
    }
  }

  size_t lex_token(size_t i, std::vector<char>& brackets) {
    const char c = source_[i];
    if (is_name_start(c)) {
      size_t j = i;
      while (j < source_.size() && is_name_char(source_[j])) ++j;
      tokens_.push_back({TokenType::kName, std::string(source_.substr(i, j - i)), i});
      return j;
    }
    if (is_digit(c)) return lex_number(i);
    if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < source_.size() && source_[j] != c) j += source_[j] == '\\' ? 2 : 1;
      if (j >= source_.size()) throw SyntaxError(i, "unterminated string literal");
      tokens_.push_back({TokenType::kString, unescape(source_.substr(i + 1, j - i - 1), i), i});
      return j + 1;
    }
    for (std::string_view two : {"//", "**", "==", "!=", "<=", ">="}) {
      if (source_.compare(i, 2, two) == 0) {
        tokens_.push_back({TokenType::kOperator, std::string(two), i});
        return i + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|;").find(c) == std::string_view::npos)
      throw SyntaxError(i, fmt::format("unexpected character '{}'", c));
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c);
    if (c == ')' || c == ']' || c == '}') {
      const char opener = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty()) throw SyntaxError(i, fmt::format("unexpected '{}'", c));
      if (brackets.back() != opener) {
        const char expected = brackets.back() == '(' ? ')' : brackets.back() == '[' ? ']' : '}';
        throw SyntaxError(i, fmt::format("unexpected '{}', expected '{}'", c, expected));
      }
      brackets.pop_back();
    }
    tokens_.push_back({TokenType::kOperator, std::string(1, c), i});
    return i + 1;
  }

  size_t lex_number(size_t i) {
    const auto digits = [&](size_t j) {
      while (j < source_.size() &&
             (is_digit(source_[j]) || (source_[j] == '_' && j + 1 < source_.size() && is_digit(source_[j + 1]))))
        ++j;
      return j;
    };
    size_t j = digits(i);
    bool is_float = false;
    // After a '.', a number is an attribute index (foo.0.1), never a float.
    const bool after_dot = i > 0 && source_[i - 1] == '.';
    if (!after_dot && j + 1 < source_.size() && source_[j] == '.' && is_digit(source_[j + 1])) {
      j = digits(j + 1);
      is_float = true;
    }
    if (!after_dot && j < source_.size() && (source_[j] == 'e' || source_[j] == 'E')) {
      size_t k = j + 1;
      if (k < source_.size() && (source_[k] == '+' || source_[k] == '-')) ++k;
      if (k < source_.size() && is_digit(source_[k])) {
        j = digits(k);
        is_float = true;
      }
    }
    std::string number;
    for (char d : source_.substr(i, j - i))
      if (d != '_') number += d;
    if (!is_float) {
      int64_t value = 0;
      if (std::from_chars(number.data(), number.data() + number.size(), value).ec != std::errc())
        throw SyntaxError(i, fmt::format("the integer {} is too large", number));
    }
    tokens_.push_back({is_float ? TokenType::kFloat : TokenType::kInteger, number, i});
    return j;
  }

  std::string_view source_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // whether the text after the last tag starts a line (lstrip_blocks)
  std::vector<Token> tokens_;
};

}  // namespace

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

std::string describe(const Token& token) {
  switch (token.type) {
    case TokenType::kData:
      return "template text";
    case TokenType::kVariableBegin:
      return "'{{'";
    case TokenType::kVariableEnd:
      return "'}}'";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "'%}'";
    case TokenType::kString:
      return "a string";
    case TokenType::kEnd:
      return "the end of the template";
    default:
      return "'" + token.value + "'";
  }
}

}  // namespace jambo::chat_template
