// Reading tokenizer.json: a JSON value together with the file and the field path it came from, so
// that every error names both (e.g. "tokenizer.json: field 'model.merges[3]': ...").
#pragma once

#include "core/json.h"

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace jambo::tokenizer {

class JsonField {
 public:
  JsonField(const nlohmann::json& value, std::string file, std::string path)
      : value_(&value), file_(std::move(file)), path_(std::move(path)) {}

  const nlohmann::json& json() const { return *value_; }
  const std::string& file() const { return file_; }
  bool is_null() const { return value_->is_null(); }

  JsonField at(std::string_view key) const;                   // required member
  std::optional<JsonField> find(std::string_view key) const;  // absent or null: nullopt
  JsonField at(size_t index) const;                           // array element
  size_t size() const;                                        // of an array

  std::string as_string() const;
  char32_t as_char() const;  // a string of exactly one character
  bool as_bool() const;
  int64_t as_int() const;
  double as_number() const;
  // The id of `token`, below id_limit: ids index tables, so a corrupt file must not ask for billions of entries.
  int32_t as_token_id(std::string_view token, int64_t id_limit) const;

  // Optional members with defaults.
  bool bool_or(std::string_view key, bool fallback) const;
  std::string string_or(std::string_view key, std::string fallback) const;

  // The "type" member, for the tagged unions of tokenizer.json.
  std::string type() const { return at("type").as_string(); }

  [[noreturn]] void fail(std::string_view problem) const;

 private:
  JsonField child(const nlohmann::json& value, std::string path) const {
    return JsonField(value, file_, std::move(path));
  }
  void require_object() const;

  const nlohmann::json* value_;
  std::string file_;
  std::string path_;
};

}  // namespace jambo::tokenizer
