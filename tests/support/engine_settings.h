// The engine settings under which every request must match its run alone (laws 4 and 5), shared by the CPU
// engine's test and the CUDA backend's: token budgets of 1 to all, 1 to 64 sequences at once, memory so tight that
// preemption happens, n = 1 alone, and each slot policy. 64 requests of up to 40 prompt tokens.
#pragma once

#include "support/engine_test_util.h"

#include <ostream>
#include <string>
#include <vector>

namespace jambo::testing {

struct EngineSetting {
  std::string name;
  int64_t max_num_batched_tokens = 64;
  int64_t max_num_seqs = 64;
  engine::SlotPolicy slot_policy = engine::SlotPolicy::Lowest;
  int64_t num_kv_blocks = 0;  // 0: plenty; else the memory budget holds exactly this many
  bool allow_n = true;        // n = 4 for some requests (needs max_num_seqs >= 4)
};

inline void PrintTo(const EngineSetting& setting, std::ostream* out) { *out << setting.name; }

constexpr int64_t kSettingKvBlockSize = 8;
constexpr int64_t kSettingMaxModelLen = 48;
constexpr int64_t kSettingNumRequests = 64;

inline std::vector<EngineSetting> engine_settings() {
  return {EngineSetting{.name = "budget_1", .max_num_batched_tokens = 1},
          EngineSetting{.name = "budget_7", .max_num_batched_tokens = 7},
          EngineSetting{.name = "budget_64"},
          EngineSetting{.name = "budget_large", .max_num_batched_tokens = 100000},
          EngineSetting{.name = "seqs_1", .max_num_seqs = 1, .allow_n = false},
          EngineSetting{.name = "seqs_8", .max_num_seqs = 8},
          EngineSetting{.name = "preemption", .max_num_batched_tokens = 32, .num_kv_blocks = 24},
          EngineSetting{.name = "n_1_only", .allow_n = false},
          EngineSetting{.name = "highest_slots", .slot_policy = engine::SlotPolicy::Highest},
          EngineSetting{.name = "random_slots", .max_num_seqs = 8, .slot_policy = engine::SlotPolicy::Random}};
}

// The setting's options for the model on the backend (num_kv_blocks: the tight budget's, or plenty), its trace
// written to trace_path.
inline engine::EngineOptions setting_options(const model::Model& model, const EngineSetting& setting,
                                             engine::BackendKind backend, int64_t weight_bytes,
                                             const std::string& trace_path) {
  const int64_t num_kv_blocks = setting.num_kv_blocks > 0 ? setting.num_kv_blocks : 64 * 4 * 6;
  engine::EngineOptions options =
      exact_engine_options(model, setting.max_num_seqs, num_kv_blocks, kSettingKvBlockSize, kSettingMaxModelLen,
                           backend);
  options.memory_budget = {.bytes = engine::exact_memory_budget(model.config, weight_bytes, setting.max_num_seqs,
                                                                num_kv_blocks, kSettingKvBlockSize, DType::F32)};
  options.max_num_batched_tokens = setting.max_num_batched_tokens;
  options.slot_policy = setting.slot_policy;
  options.slot_seed = 3;
  options.trace_path = trace_path;
  return options;
}

// After the run: no law broken, nothing left held, and under the tight budget both kinds of victim preempted
// (sequences still on their prompt, and samples that must recompute tokens they generated).
inline void expect_setting_held(const EngineSetting& setting, const engine::EngineCounters& counters,
                                const std::string& trace_path) {
  EXPECT_EQ(counters.law_violations, 0);
  EXPECT_EQ(counters.num_running + counters.num_waiting + counters.slots_used + counters.kv_blocks_used, 0);
  if (setting.num_kv_blocks == 0) return;
  int64_t num_on_prompt = 0, num_with_generated = 0;
  for (const auto& event : read_trace(trace_path, "event")) {
    if (event["event"] != "preempted") continue;
    num_on_prompt += event["num_generated"] == 0;
    num_with_generated += event["num_generated"] > 0;
  }
  EXPECT_EQ(num_on_prompt + num_with_generated, counters.preemptions);
  EXPECT_GT(num_on_prompt, 0);
  EXPECT_GT(num_with_generated, 0);
}

}  // namespace jambo::testing
