// JSON helpers for every reader of user files: one way to read a JSON file, and a bounded description
// of a value for error messages (dump() recurses, so a deeply nested value from a user must never
// reach it).
#pragma once

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace jambo {

// The value itself when it is flat and short (strings cut at 60 characters, arrays of up to 16
// scalars), else "an array of N elements" or "an object".
inline std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) {
    const bool flat = value.size() <= 16 && std::none_of(value.begin(), value.end(), [](const nlohmann::json& item) {
                        return item.is_structured() || (item.is_string() && item.get_ref<const std::string&>().size() > 60);
                      });
    return flat ? value.dump() : fmt::format("an array of {} elements", value.size());
  }
  if (value.is_object()) return "an object";
  if (value.is_string() && value.get_ref<const std::string&>().size() > 60)
    return nlohmann::json(value.get_ref<const std::string&>().substr(0, 60)).dump() + "...";
  return value.dump();
}

// Reads and parses a JSON file; errors name the file (missing, not a regular file, malformed).
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::error_code error;
  JAMBO_REQUIRE(std::filesystem::is_regular_file(path, error), "{}: no such file", path.string());
  std::ifstream stream(path, std::ios::binary);
  JAMBO_REQUIRE(stream.good(), "{}: cannot open the file", path.string());
  std::ostringstream text;
  text << stream.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& parse_error) {  // also out_of_range: a number such as 1e400
    fail("{}: malformed JSON: {}", path.string(), parse_error.what());
  }
}

}  // namespace jambo
