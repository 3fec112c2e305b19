#include "forensics/trace_reader.h"

#include "core/json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <climits>
#include <functional>

namespace jambo::forensics {
namespace {

using nlohmann::json;

// Fields of a trace line, or the fallback when a line lacks them or has another type: a damaged trace
// is still read as far as it goes.
int64_t integer_or(const json& line, const char* key, int64_t fallback) {
  return line.contains(key) && line[key].is_number_integer() ? line[key].get<int64_t>() : fallback;
}

std::string string_or(const json& line, const char* key, const std::string& fallback) {
  return line.contains(key) && line[key].is_string() ? line[key].get<std::string>() : fallback;
}

// Request ids may be written as strings or numbers; compare them as text.
std::string id_text(const json& id) { return id.is_string() ? id.get<std::string>() : id.dump(); }

std::string row_line(int64_t step, const json& row) {
  const int64_t start = integer_or(row, "start", 0);
  const int64_t num_tokens = integer_or(row, "num_tokens", 0);
  const bool range_fits = num_tokens > 1 && start >= 0 && start <= INT64_MAX - num_tokens;
  const std::string positions =
      range_fits ? fmt::format("positions {}..{} ({} tokens)", start, start + num_tokens - 1, num_tokens)
                 : fmt::format("position {} ({} tokens)", start, num_tokens);
  return fmt::format("step {:<6} {:<8} sample {} seq {}  {}  slot {} gen {}  kv blocks {}", step,
                     string_or(row, "phase", "?"), integer_or(row, "sample", 0), integer_or(row, "sequence", -1),
                     positions, integer_or(row, "slot", -1), integer_or(row, "generation", 0),
                     row.contains("kv_blocks") ? describe_json(row["kv_blocks"]) : "[]");
}

std::string event_line(const json& event) {
  std::string details;
  for (const auto& [key, value] : event.items()) {
    if (key == "type" || key == "step" || key == "request" || key == "event" || key == "sample" || key == "sequence")
      continue;
    details += fmt::format("  {}={}", key, value.is_string() ? value.get<std::string>() : describe_json(value));
  }
  return fmt::format("step {:<6} {:<8} sample {} seq {}{}", integer_or(event, "step", 0),
                     string_or(event, "event", "?"), integer_or(event, "sample", 0), integer_or(event, "sequence", -1),
                     details);
}

// The events and rows for which `matches` holds, in order.
RequestLife read_life(std::istream& trace, const std::function<bool(const json&)>& matches) {
  RequestLife life;
  std::string text;
  for (int64_t number = 1; std::getline(trace, text); ++number) {
    json line;
    std::string why = "not a JSON object";
    try {
      line = parse_json(text);
    } catch (const Error& error) {  // unreadable: counted below
      why = error.what();
    }
    if (!line.is_object()) {
      if (life.num_unreadable++ == 0) life.first_unreadable = fmt::format("line {}: {}", number, why);
      continue;
    }
    if (string_or(line, "type", "") == "event") {
      if (matches(line)) life.lines.push_back(event_line(line));
      continue;
    }
    if (!line.contains("rows") || !line["rows"].is_array()) continue;
    for (const json& row : line["rows"])
      if (row.is_object() && matches(row)) life.lines.push_back(row_line(integer_or(line, "step", 0), row));
  }
  return life;
}

}  // namespace

RequestLife read_request_life(std::istream& trace, const std::string& request_id) {
  return read_life(
      trace, [&](const json& line) { return line.contains("request") && id_text(line["request"]) == request_id; });
}

RequestLife read_sequence_life(std::istream& trace, int64_t sequence_id) {
  return read_life(trace, [&](const json& line) { return integer_or(line, "sequence", -1) == sequence_id; });
}

}  // namespace jambo::forensics
