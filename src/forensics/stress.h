// `jambo stress`: a workload built to surface state-cache bugs, after the two historical ones. Prompts
// from one token to long (many of one token), several samples per prompt, requests arriving while
// others run, under a tight memory budget and a small token budget (fast slot reuse, one-token
// admissions, preemption), or over a state pool past 2^32 elements with many samples per prompt; then
// every sample is compared with the reference path.
#pragma once

#include "engine/engine.h"
#include "forensics/compare.h"

#include <functional>
#include <vector>

namespace jambo::forensics {

struct StressWorkload {
  int64_t num_requests = 200;
  int64_t max_prompt_tokens = 160;  // prompt lengths are log-uniform in [1, max]; a fifth are one token
  int64_t max_new_tokens = 12;      // each request asks for 1..max
  int64_t min_samples = 1;          // n in min..max
  int64_t max_samples = 4;
  double arrivals_per_step = 1.5;  // mean new requests per engine step (Poisson)
  uint64_t seed = 0;
  // 0: every prompt its own. K: K prefixes of lengths uniform in [1/4, 3/4] of the longest prompt, and every prompt of
  // more than one token one of them plus its own tokens (the prefix cache resumes, saves and evicts all the time).
  int64_t num_shared_prefixes = 0;
};

// The requests of a workload, in arrival order: half greedy, half sampled with their own seed. Throws
// jambo::Error when min_samples is not in [1, max_samples].
std::vector<engine::RequestSpec> make_stress_requests(const StressWorkload& workload, int64_t vocab_size);

struct StressResult {
  std::vector<engine::SampleOutput> samples;  // in finishing order
  engine::EngineCounters counters;            // of the engine at the end of the run
  std::string prefix_caching_status;          // the engine's (engine.h)
  int64_t state_elements_per_slot = 0;  // the engine's pool holds counters.slots_total such slots
  double engine_seconds = 0.0;
  double reference_seconds = 0.0;
  CompareSummary comparison;
};

struct StressProgress {
  std::function<void(int64_t step, int64_t num_finished_requests)> on_engine_step;
  std::function<void(int64_t done, int64_t total)> on_reference;  // samples re-scored
};

// Runs the workload (arrivals over time), frees the engine and its backend, then compares every sample
// with the reference path on reference.backend.
StressResult run_stress(const model::Model& model, const tokenizer::Tokenizer* tokenizer,
                        const engine::EngineOptions& options, const StressWorkload& workload, double threshold,
                        const ReferenceOptions& reference, const StressProgress& progress = {});

}  // namespace jambo::forensics
