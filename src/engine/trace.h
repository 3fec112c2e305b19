// The JSONL trace (law 6, --trace FILE): one line per step with every row (request, sample, phase,
// positions, tokens, slot, generation, KV blocks) and one line per lifecycle event.
#pragma once

#include "engine/request.h"
#include "engine/scheduler.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace jambo::engine {

class Trace {
 public:
  // An empty path traces nothing.
  explicit Trace(const std::string& path);

  bool enabled() const { return out_.is_open(); }
  void step(int64_t step, const std::vector<ScheduledRow>& rows);
  // event: queued, admitted, prefill_done, preempted, finished, aborted or failed (with its error); details are added
  // to the line.
  void event(int64_t step, const Sequence& sequence, const char* event,
             nlohmann::json details = nlohmann::json::object());

 private:
  void write(const nlohmann::json& line);

  std::ofstream out_;
};

}  // namespace jambo::engine
