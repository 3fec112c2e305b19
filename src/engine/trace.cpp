#include "engine/trace.h"

#include "core/error.h"

namespace jambo::engine {

Trace::Trace(const std::string& path) {
  if (path.empty()) return;
  out_.open(path);
  JAMBO_REQUIRE(out_.is_open(), "cannot write the trace file {}", path);
}

void Trace::write(const nlohmann::json& line) {
  out_ << line.dump() << '\n';
  out_.flush();  // a step that throws must still leave the lines before it
}

void Trace::step(int64_t step, const std::vector<ScheduledRow>& rows) {
  if (!enabled()) return;
  nlohmann::json json_rows = nlohmann::json::array();
  for (const ScheduledRow& row : rows) {
    const Sequence& sequence = *row.sequence;
    const auto first = sequence.tokens().begin() + sequence.num_computed();
    json_rows.push_back({{"request", sequence.request.spec.id},
                         {"sample", sequence.sample},
                         {"sequence", sequence.id},
                         {"phase", sequence.state() == SequenceState::Decoding ? "decode" : "prefill"},
                         {"start", sequence.num_computed()},
                         {"num_tokens", row.num_tokens},
                         {"tokens", std::vector<int32_t>(first, first + row.num_tokens)},
                         {"has_initial_state", sequence.has_state()},
                         {"slot", sequence.lease->slot},
                         {"generation", sequence.lease->generation},
                         {"kv_blocks", sequence.block_table}});
  }
  write({{"type", "step"}, {"step", step}, {"rows", json_rows}});
}

void Trace::event(int64_t step, const Sequence& sequence, const char* event, nlohmann::json details) {
  if (!enabled()) return;
  nlohmann::json line = {
      {"type", "event"},         {"step", step},  {"request", sequence.request.spec.id}, {"sample", sequence.sample},
      {"sequence", sequence.id}, {"event", event}};
  line.update(details);
  write(line);
}

}  // namespace jambo::engine
