// `jambo stress`: a workload built to surface state-cache bugs, after the two historical ones. Prompts
// from one token to long (many of one token), several samples per prompt, requests arriving while
// others run, under a tight memory budget and a small token budget (fast slot reuse, one-token
// admissions, preemption); then every sample is compared with the reference path.
#pragma once

#include "engine/engine.h"
#include "forensics/compare.h"

#include <functional>
#include <vector>

namespace jambo {

struct StressWorkload {
  int64_t num_requests = 200;
  int64_t max_prompt_tokens = 160;  // prompt lengths are log-uniform in [1, max]; a fifth are one token
  int64_t max_new_tokens = 12;      // each request asks for 1..max
  int64_t max_samples = 4;          // n in 1..max
  double arrivals_per_step = 1.5;   // mean new requests per engine step (Poisson)
  uint64_t seed = 0;
};

// The requests of a workload, in arrival order: half greedy, half sampled with their own seed.
std::vector<RequestSpec> make_stress_requests(const StressWorkload& workload, int64_t vocab_size);

struct StressResult {
  std::vector<SampleOutput> samples;  // in finishing order
  EngineCounters counters;
  CompareSummary comparison;
};

// Runs the workload (arrivals over time) and compares every sample with the reference path.
// on_step(step, num_finished_requests) reports progress.
StressResult run_stress(const Model& model, const Tokenizer* tokenizer, const EngineOptions& options,
                        const StressWorkload& workload, double threshold,
                        const std::function<void(int64_t, int64_t)>& on_step = {});

}  // namespace jambo
