// JSON helpers for every reader of user files and requests: one way to parse JSON text (nesting limited while
// parsing), one way to read a JSON file, integers read without wrapping, and a bounded description of a value
// for error messages.
#pragma once

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace jambo {

// Far deeper than any file or request jambo reads, and shallow enough that nlohmann's recursive copy, dump and
// comparison stay well inside the stack.
inline constexpr int kMaxJsonDepth = 256;

// JSON nested deeper than kMaxJsonDepth levels; `field` is the top-level member that holds it ("" when the
// value is not inside an object), so that a request can name it.
class JsonTooDeep : public Error {
 public:
  explicit JsonTooDeep(std::string field)
      : Error(field.empty() ? fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth)
                            : fmt::format("field '{}': JSON nested deeper than {} levels", field, kMaxJsonDepth)),
        field(std::move(field)) {}
  std::string field;
};

// Parses JSON text; the caller names where it came from. Malformed text is an Error ("malformed JSON: ..."),
// nesting past kMaxJsonDepth a JsonTooDeep, thrown while parsing, before any deeper value exists.
inline nlohmann::json parse_json(std::string_view text) {
  using Event = nlohmann::json::parse_event_t;
  std::string field;
  const auto limit_depth = [&field](int depth, Event event, nlohmann::json& parsed) {
    // `depth` counts the containers around this event: the top-level value is at depth 0.
    if (event == Event::key && depth == 1) field = parsed.get<std::string>();
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      throw JsonTooDeep(field);
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit_depth);
  } catch (const nlohmann::json::exception& error) {  // also out_of_range: a number such as 1e400
    fail("malformed JSON: {}", error.what());
  }
}

// The value as an int64_t; nothing when it is not an integer or lies beyond int64_t (get<int64_t>() would wrap
// such an unsigned value to a negative one).
inline std::optional<int64_t> json_int64(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return std::nullopt;
  return value.get<int64_t>();
}

// The value itself when it is flat and short (strings cut at 60 bytes where a character starts, arrays of up to 16
// scalars), else "an array of N elements" or "an object".
inline std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) {
    const bool flat = value.size() <= 16 && std::none_of(value.begin(), value.end(), [](const nlohmann::json& item) {
                        return item.is_structured() || (item.is_string() && item.get_ref<const std::string&>().size() > 60);
                      });
    return flat ? value.dump() : fmt::format("an array of {} elements", value.size());
  }
  if (value.is_object()) return "an object";
  if (value.is_string() && value.get_ref<const std::string&>().size() > 60) {
    // Cut where a character starts: half a UTF-8 sequence is no string the JSON writer takes.
    const std::string& text = value.get_ref<const std::string&>();
    size_t cut = 60;
    while (cut > 0 && (uint8_t(text[cut]) & 0xC0) == 0x80) --cut;
    return nlohmann::json(text.substr(0, cut)).dump() + "...";
  }
  return value.dump();
}

// Reads and parses a JSON file; errors name the file (missing, not a regular file, malformed, too deep). Only a
// regular file is opened: a FIFO or a device would block or never end.
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  JAMBO_REQUIRE(std::filesystem::exists(status), "{}: no such file", path.string());
  JAMBO_REQUIRE(std::filesystem::is_regular_file(status), "{}: not a regular file", path.string());
  std::ifstream stream(path, std::ios::binary);
  JAMBO_REQUIRE(stream.good(), "{}: cannot open the file", path.string());
  std::ostringstream text;
  text << stream.rdbuf();
  try {
    return parse_json(text.str());
  } catch (const Error& parse_error) {
    fail("{}: {}", path.string(), parse_error.what());
  }
}

}  // namespace jambo
