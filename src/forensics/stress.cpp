#include "forensics/stress.h"

#include "engine/memory_budget.h"
#include "engine/request_json.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <utility>

namespace jambo::forensics {

std::vector<engine::RequestSpec> make_stress_requests(const StressWorkload& workload, int64_t vocab_size) {
  JAMBO_REQUIRE(workload.min_samples >= 1 && workload.min_samples <= workload.max_samples,
                "the stress workload's samples per prompt must satisfy 1 <= min ({}) <= max ({})", workload.min_samples,
                workload.max_samples);
  std::mt19937_64 rng(workload.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto uniform_int = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng);
  };
  const auto log_uniform_length = [&] {
    return std::max<int64_t>(1, int64_t(std::exp(unit(rng) * std::log(double(workload.max_prompt_tokens)))));
  };
  std::vector<std::vector<int32_t>> prefixes(size_t(std::max<int64_t>(workload.num_shared_prefixes, 0)));
  const int64_t max_prompt = workload.max_prompt_tokens;
  for (std::vector<int32_t>& prefix : prefixes)
    for (int64_t t = uniform_int(std::max<int64_t>(1, max_prompt / 4), std::max<int64_t>(1, 3 * max_prompt / 4)); t > 0;
         --t)
      prefix.push_back(int32_t(uniform_int(0, vocab_size - 1)));
  std::vector<engine::RequestSpec> requests;
  for (int64_t i = 0; i < workload.num_requests; ++i) {
    engine::RequestSpec spec;
    spec.id = "stress-" + std::to_string(i);
    const bool one_token = unit(rng) < 0.2;
    const int64_t num_prompt = one_token ? 1 : log_uniform_length();
    if (!one_token && !prefixes.empty()) {
      const std::vector<int32_t>& prefix = prefixes[size_t(uniform_int(0, int64_t(prefixes.size()) - 1))];
      spec.prompt_ids.assign(prefix.begin(), prefix.begin() + std::min<int64_t>(int64_t(prefix.size()),
                                                                                workload.max_prompt_tokens - 1));
    }
    const int64_t num_shared = int64_t(spec.prompt_ids.size());
    const int64_t num_own =
        num_shared == 0 ? num_prompt : std::clamp<int64_t>(num_prompt, 1, workload.max_prompt_tokens - num_shared);
    for (int64_t t = 0; t < num_own; ++t) spec.prompt_ids.push_back(int32_t(uniform_int(0, vocab_size - 1)));
    spec.n = uniform_int(workload.min_samples, workload.max_samples);
    spec.stop.max_tokens = uniform_int(1, workload.max_new_tokens);
    if (unit(rng) < 0.5) {
      spec.sampling.temperature = 0.8;
      spec.sampling.top_p = 0.95;
      spec.sampling.seed = rng();
    }
    requests.push_back(std::move(spec));
  }
  return requests;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Engine samples in the form `jambo compare` reads, so both audit exactly the same thing.
SampleFile as_sample_file(const std::vector<engine::SampleOutput>& samples, std::string_view backend,
                          int64_t vocab_size) {
  SampleFile file;
  for (size_t i = 0; i < samples.size(); ++i)
    for (Sample& sample : parse_sample_line(sample_to_json(samples[i], backend), int64_t(i) + 1, vocab_size))
      file.samples.push_back(std::move(sample));
  return file;
}

// The engine phase: the requests arrive over the steps (Poisson) until all are done. The engine, its
// backend and their memory are gone when this returns.
void run_engine(const model::Model& model, const tokenizer::Tokenizer* tokenizer, const engine::EngineOptions& options,
                const StressWorkload& workload, const StressProgress& progress, StressResult& result) {
  const std::vector<engine::RequestSpec> requests = make_stress_requests(workload, model.config.vocab_size);
  engine::Engine engine(model, tokenizer, options);
  std::mt19937_64 arrivals(workload.seed + 1);
  std::poisson_distribution<int64_t> arrivals_per_step(workload.arrivals_per_step);
  std::map<std::string, int64_t> samples_left;
  size_t num_added = 0;
  int64_t num_finished = 0;
  for (int64_t step = 0; num_added < requests.size() || engine.has_unfinished(); ++step) {
    // At least one arrival when idle, so the run never stalls on an empty engine.
    int64_t num_arriving = arrivals_per_step(arrivals);
    if (!engine.has_unfinished()) num_arriving = std::max<int64_t>(num_arriving, 1);
    for (; num_arriving > 0 && num_added < requests.size(); --num_arriving, ++num_added) {
      engine.add_request(requests[num_added]);
      samples_left[requests[num_added].id] = requests[num_added].n;
    }
    for (engine::SampleOutput& sample : engine.step()) {
      if (--samples_left[sample.id] == 0) ++num_finished;
      result.samples.push_back(std::move(sample));
    }
    if (progress.on_engine_step) progress.on_engine_step(step, num_finished);
  }
  result.counters = engine.counters();
  result.prefix_caching_status = engine.prefix_caching_status();
}

}  // namespace

StressResult run_stress(const model::Model& model, const tokenizer::Tokenizer* tokenizer,
                        const engine::EngineOptions& options, const StressWorkload& workload, double threshold,
                        const ReferenceOptions& reference, const StressProgress& progress) {
  StressResult result;
  result.state_elements_per_slot = engine::state_elements_per_slot(model.config);
  const Clock::time_point engine_start = Clock::now();
  run_engine(model, tokenizer, options, workload, progress, result);
  result.engine_seconds = seconds_since(engine_start);
  const Clock::time_point reference_start = Clock::now();
  SampleFile samples = as_sample_file(result.samples, engine::describe(options.backend), model.config.vocab_size);
  result.comparison = compare_samples(model, std::move(samples), threshold, reference, progress.on_reference);
  result.reference_seconds = seconds_since(reference_start);
  return result;
}

}  // namespace jambo::forensics
