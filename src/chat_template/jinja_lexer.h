// The Jinja lexer: template text in, tokens out, with the whitespace rules of the environment
// transformers renders chat templates with (trim_blocks and lstrip_blocks on, '-' and '+' markers,
// the template's final newline dropped).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace jambo::chat_template {

// A template that does not parse; offset is a byte offset into the normalized source.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(size_t offset, const std::string& message) : std::runtime_error(message), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

enum class TokenType {
  kData,  // template text between tags, after whitespace control
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,  // value holds the decoded string
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenType type;
  std::string value;
  size_t offset;
};

// Line endings as jinja2 reads them: \r\n and \r become \n, and one final newline is dropped.
std::string normalize_newlines(std::string_view source);
// Tokenizes a normalized source; throws SyntaxError.
std::vector<Token> tokenize(std::string_view source);
// How a token is named in "expected ..., found ..." messages.
std::string describe(const Token& token);

}  // namespace jambo::chat_template
