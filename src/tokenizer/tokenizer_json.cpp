#include "tokenizer/tokenizer_json.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {

void JsonField::fail(std::string_view problem) const {
  if (path_.empty()) jambo::fail("{}: {}", file_, problem);
  jambo::fail("{}: field '{}': {}", file_, path_, problem);
}

void JsonField::require_object() const {
  if (!value_->is_object()) fail("expected a JSON object");
}

JsonField JsonField::at(std::string_view key) const {
  require_object();
  const std::string path = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  auto it = value_->find(key);
  if (it == value_->end()) jambo::fail("{}: missing field '{}'", file_, path);
  return child(*it, path);
}

std::optional<JsonField> JsonField::find(std::string_view key) const {
  require_object();
  auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) return std::nullopt;
  return child(*it, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
}

JsonField JsonField::at(size_t index) const {
  if (!value_->is_array()) fail("expected a JSON array");
  if (index >= value_->size()) fail(fmt::format("index {} out of range", index));
  return child((*value_)[index], fmt::format("{}[{}]", path_, index));
}

size_t JsonField::size() const {
  if (!value_->is_array()) fail("expected a JSON array");
  return value_->size();
}

std::string JsonField::as_string() const {
  if (!value_->is_string()) fail("expected a string");
  return value_->get<std::string>();
}

char32_t JsonField::as_char() const {
  const std::string text = as_string();
  const auto chars = unicode::split_chars(text);
  if (chars.size() != 1 || !unicode::is_valid_utf8(text)) fail("expected a single character");
  return chars[0].code_point;
}

bool JsonField::as_bool() const {
  if (!value_->is_boolean()) fail("expected true or false");
  return value_->get<bool>();
}

int64_t JsonField::as_int() const {
  if (!value_->is_number_integer()) fail("expected an integer");
  const std::optional<int64_t> integer = json_int64(*value_);
  if (!integer) fail(fmt::format("{} is out of range", value_->dump()));
  return *integer;
}

int32_t JsonField::as_token_id(std::string_view token, int64_t id_limit) const {
  const int64_t id = as_int();
  if (id < 0 || id >= id_limit)
    fail(fmt::format("token '{}' has id {}; ids must be at least 0 and below {}, the number of tokens in "
                     "model.vocab and added_tokens",
                     token, id, id_limit));
  return static_cast<int32_t>(id);
}

double JsonField::as_number() const {
  if (!value_->is_number()) fail("expected a number");
  return value_->get<double>();
}

bool JsonField::bool_or(std::string_view key, bool fallback) const {
  auto field = find(key);
  return field ? field->as_bool() : fallback;
}

std::string JsonField::string_or(std::string_view key, std::string fallback) const {
  auto field = find(key);
  return field ? field->as_string() : fallback;
}

}  // namespace jambo::tokenizer
