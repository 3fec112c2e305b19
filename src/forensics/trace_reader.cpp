#include "forensics/trace_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace jambo {
namespace {

using nlohmann::json;

// Request ids may be written as strings or numbers; compare them as text.
std::string id_text(const json& id) { return id.is_string() ? id.get<std::string>() : id.dump(); }

std::string row_line(int64_t step, const json& row) {
  const int64_t start = row.value("start", int64_t(0));
  const int64_t num_tokens = row.value("num_tokens", int64_t(0));
  const std::string positions = num_tokens == 1 ? fmt::format("position {}", start)
                                                : fmt::format("positions {}..{} ({} tokens)", start,
                                                              start + num_tokens - 1, num_tokens);
  return fmt::format("step {:<6} {:<8} sample {}  {}  slot {} gen {}  kv blocks {}", step,
                     row.value("phase", std::string("?")), row.value("sample", int64_t(0)), positions,
                     row.value("slot", int64_t(-1)), row.value("generation", int64_t(0)),
                     row.contains("kv_blocks") ? row["kv_blocks"].dump() : "[]");
}

std::string event_line(const json& event) {
  std::string details;
  for (const auto& [key, value] : event.items()) {
    if (key == "type" || key == "step" || key == "request" || key == "event" || key == "sample") continue;
    details += fmt::format("  {}={}", key, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return fmt::format("step {:<6} {:<8} sample {}{}", event.value("step", int64_t(0)),
                     event.value("event", std::string("?")), event.value("sample", int64_t(0)), details);
}

}  // namespace

RequestLife read_request_life(std::istream& trace, const std::string& request_id) {
  RequestLife life;
  std::string text;
  while (std::getline(trace, text)) {
    const json line = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!line.is_object()) {
      ++life.num_unreadable;
      continue;
    }
    if (line.value("type", std::string()) == "event") {
      if (line.contains("request") && id_text(line["request"]) == request_id) life.lines.push_back(event_line(line));
      continue;
    }
    if (!line.contains("rows") || !line["rows"].is_array()) continue;
    for (const json& row : line["rows"])
      if (row.is_object() && row.contains("request") && id_text(row["request"]) == request_id)
        life.lines.push_back(row_line(line.value("step", int64_t(0)), row));
  }
  return life;
}

}  // namespace jambo
