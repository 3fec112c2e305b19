// jambo stress: a workload built to surface state-cache bugs, then `compare` on every sample. Defaults
// finish in well under a minute on the demo model with two cores; bench/stress_gpu.sh runs it at scale.
#include "engine/backend_factory.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "engine/memory_budget.h"
#include "engine/request_json.h"
#include "forensics/report.h"
#include "forensics/stress.h"

#include <fstream>

#include <unistd.h>

namespace jambo::cli {
namespace {

struct StressOptions {
  ModelOptions model;
  EngineFlags engine;
  forensics::StressWorkload workload;
  double threshold = forensics::kDefaultCompareThreshold;
  forensics::ReferenceOptions reference;  // backend and weight mode: the engine's unless given
  int64_t num_budget_slots = 0;  // 0: 2 * max_samples + 4
  std::string inject = "none";
  std::string output_path;
  std::string report_path;
  std::string summary_path;
};

engine::EngineFaults parse_injection(const std::string& name) {
  engine::EngineFaults faults;
  if (name == "decode-before-prefill") faults.decode_before_prefill = true;
  if (name == "offset-wrap") faults.wrap_state_offsets = true;
  if (name == "stale-checkpoint") faults.serve_stale_checkpoint = true;
  return faults;
}

// A stale checkpoint can only be served where requests resume from cached prefixes.
void check_injection(const StressOptions& options) {
  if (options.inject != "stale-checkpoint") return;
  if (options.workload.num_shared_prefixes == 0)
    throw UsageError("--inject stale-checkpoint needs --shared-prefixes K: without shared prefixes no request "
                     "resumes from a checkpoint");
  if (!options.engine.options.enable_prefix_caching)
    throw UsageError("--inject stale-checkpoint needs prefix caching, which --no-enable-prefix-caching turns off");
}

void write_outputs(const StressOptions& options, const forensics::StressResult& result,
                   const tokenizer::Tokenizer* tokenizer) {
  if (!options.output_path.empty()) {
    std::ofstream out(options.output_path);
    JAMBO_REQUIRE(out, "cannot write output file '{}'", options.output_path);
    const std::string backend = engine::describe(options.engine.options.backend);
    for (const engine::SampleOutput& sample : result.samples) out << sample_to_json(sample, backend).dump() << '\n';
  }
  if (!options.summary_path.empty()) {
    std::ofstream out(options.summary_path);
    JAMBO_REQUIRE(out, "cannot write summary file '{}'", options.summary_path);
    out << summary_json(result.comparison).dump(2) << '\n';
  }
  if (!options.report_path.empty()) {
    std::ofstream out(options.report_path);
    JAMBO_REQUIRE(out, "cannot write report file '{}'", options.report_path);
    out << render_html_report(result.comparison, tokenizer);
  }
}

constexpr int64_t kTightCheckpoints = 3;

// --memory-budget tight: state slots for a few sequences, so that slots are reused fast and requests
// preempted, and KV blocks for the largest request alone, so that every request still fits (and, with shared
// prefixes, kTightCheckpoints prefix-cache checkpoints unless --max-num-checkpoints says otherwise).
void apply_tight_budget(StressOptions& options, const model::Model& model) {
  engine::EngineOptions& engine = options.engine.options;
  const forensics::StressWorkload& workload = options.workload;
  const int64_t longest_request = workload.max_prompt_tokens + workload.max_new_tokens;
  if (!engine.max_model_len) engine.max_model_len = longest_request;
  if (*engine.max_model_len < longest_request)
    throw UsageError(fmt::format("--max-model-len {} is shorter than the longest request ({} tokens)",
                                 *engine.max_model_len, longest_request));
  if (!options.engine.tight_budget) return;
  // More slots than KV blocks can serve at once: sequences then compete for blocks and get preempted.
  const int64_t num_slots = options.num_budget_slots > 0 ? options.num_budget_slots : 2 * workload.max_samples + 4;
  if (num_slots < workload.max_samples)
    throw UsageError(
        fmt::format("--budget-slots {} cannot hold the {} samples of one request", num_slots, workload.max_samples));
  const int64_t num_blocks = workload.max_samples * backend::kv_blocks_for(*engine.max_model_len, engine.kv_block_size);
  engine.max_num_seqs = std::min(engine.max_num_seqs, num_slots);
  // A pool of a few checkpoints, so that the prefix cache evicts all the time; a checkpoint takes a slot's memory.
  if (workload.num_shared_prefixes > 0 && !engine.max_num_checkpoints) engine.max_num_checkpoints = kTightCheckpoints;
  const int64_t num_checkpoints = engine.enable_prefix_caching ? engine.max_num_checkpoints.value_or(0) : 0;
  const engine::BackendChoice& backend = engine.backend;
  const engine::MemoryShare share = engine::memory_share(backend, model);
  engine.memory_budget = {.bytes = engine::exact_memory_budget(share.config, share.weight_bytes,
                                                               num_slots + num_checkpoints, num_blocks,
                                                               engine.kv_block_size, backend.state_dtype)};
}

std::string describe_backend(engine::BackendKind kind, engine::CudaWeights cuda_weights) {
  return kind == engine::BackendKind::Cuda ? fmt::format("cuda ({} weights)", name(cuda_weights))
                                           : std::string(name(kind));
}

// Where the engine's state pool and its highest used slot lie against 2^32 elements (law 3): a 32-bit
// offset would wrap there.
std::string describe_state_pool(const forensics::StressResult& result) {
  constexpr int64_t kWrap = int64_t(1) << 32;
  const engine::EngineCounters& counters = result.counters;
  const int64_t per_slot = result.state_elements_per_slot;
  const int64_t pool = counters.slots_total * per_slot;
  const auto past_wrap = [&](int64_t end) { return end > kWrap ? "past 2^32" : "within 2^32"; };
  std::string text =
      fmt::format("state pool {} slots x {} = {} elements ({})", counters.slots_total, per_slot, pool, past_wrap(pool));
  const int64_t top = counters.highest_slot_used;
  if (top >= 0)
    text += fmt::format("; top slot used {}: elements [{}, {}) ({})", top, top * per_slot, (top + 1) * per_slot,
                        past_wrap((top + 1) * per_slot));
  return text;
}

int run_stress_command(StressOptions& options) {
  // Random weights live only on the GPU when both phases run there; a CPU phase needs them on the host.
  const engine::BackendKind engine_backend = options.engine.options.backend.kind;
  const model::Model model =
      options.model.load(options.reference.backend == engine_backend ? engine_backend : engine::BackendKind::Cpu);
  const std::optional<tokenizer::Tokenizer> tokenizer = options.model.load_tokenizer();
  check_injection(options);
  apply_tight_budget(options, model);
  engine::EngineOptions engine_options = options.engine.options;
  engine_options.faults = parse_injection(options.inject);
  const forensics::StressWorkload& workload = options.workload;
  const forensics::ReferenceOptions& reference = options.reference;
  const DType state_dtype = engine_options.backend.state_dtype;
  const std::string state_note =
      state_dtype == DType::F32 ? "" : fmt::format(", {} state", engine::state_dtype_name(state_dtype));

  fmt::print(stderr,
             "stress: {} requests (prompts 1..{} tokens{}, n {}..{}, 1..{} new tokens), memory budget {}, "
             "slot policy {}, injection {}; engine on {}, reference on {}\n",
             workload.num_requests, workload.max_prompt_tokens,
             workload.num_shared_prefixes > 0 ? fmt::format(" from {} shared prefixes", workload.num_shared_prefixes)
                                              : "",
             workload.min_samples, workload.max_samples,
             workload.max_new_tokens, to_string(engine_options.memory_budget), name(engine_options.slot_policy),
             options.inject, describe_backend(engine_backend, engine_options.backend.cuda_weights) + state_note,
             describe_backend(reference.backend, reference.cuda_weights));
  const bool interactive = isatty(STDERR_FILENO);
  ProgressLine engine_progress("stress: engine", "requests finished", interactive);
  ProgressLine reference_progress("stress: reference", "samples re-scored", interactive);
  forensics::StressProgress progress;
  progress.on_engine_step = [&](int64_t, int64_t num_finished) {
    engine_progress.update(num_finished, workload.num_requests);
  };
  progress.on_reference = [&](int64_t done, int64_t total) { reference_progress.update(done, total); };
  const forensics::StressResult result = run_stress(model, tokenizer ? &*tokenizer : nullptr, engine_options, workload,
                                                    options.threshold, reference, progress);
  write_outputs(options, result, tokenizer ? &*tokenizer : nullptr);
  const engine::EngineCounters& counters = result.counters;
  fmt::print(
      "stress: {}; {}; engine {:.1f} s, {} steps, {} preemptions, {} slot reuses, {} law violations; {}; reference "
      "{:.1f} s\n",
      describe_comparison(result.comparison), describe_state_pool(result), result.engine_seconds, counters.steps,
      counters.preemptions, counters.slot_reuses, counters.law_violations,
      describe_prefix_cache(counters, result.prefix_caching_status), result.reference_seconds);
  return compare_exit_code(result.comparison);
}

}  // namespace

void add_stress_command(CLI::App& app) {
  auto options = std::make_shared<StressOptions>();
  CLI::App* command = app.add_subcommand(
      "stress",
      "a workload built to surface state bugs (tight memory, one-token admissions, n > 1, slot reuse), "
      "then compare every sample with the reference path; exit code 3 when any is flagged");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  forensics::StressWorkload& workload = options->workload;
  const auto count = CLI::Range(int64_t(1), int64_t(1) << 20);
  command->add_option("--requests", workload.num_requests, "requests in the workload")
      ->check(count)
      ->capture_default_str();
  command->add_option("--max-prompt-tokens", workload.max_prompt_tokens, "longest prompt")
      ->check(count)
      ->capture_default_str();
  command->add_option("--max-new-tokens", workload.max_new_tokens, "most tokens a request asks for")
      ->check(count)
      ->capture_default_str();
  command->add_option("--min-n", workload.min_samples, "fewest samples per prompt (n is uniform in min-n..max-n)")
      ->check(count)
      ->capture_default_str();
  command->add_option("--max-n", workload.max_samples, "most samples per prompt")->check(count)->capture_default_str();
  command->add_option("--arrival-rate", workload.arrivals_per_step, "mean new requests per step")
      ->check(CLI::Range(1e-3, 1e6))
      ->capture_default_str();
  command->add_option("--seed", workload.seed, "seed of the workload")->capture_default_str();
  command
      ->add_option("--shared-prefixes", workload.num_shared_prefixes,
                   "K: prompts start with one of K common prefixes of varied lengths (with --memory-budget tight, a "
                   "pool of 3 prefix-cache checkpoints, so that the cache evicts all the time); 0: none")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->capture_default_str();
  command
      ->add_option("--threshold", options->threshold,
                   "flag a sample whose |dlogprob| exceeds this (default: 0 where the engine and its reference are "
                   "one bitwise-invariant backend, the CPU or CUDA on --cuda-gemm invariant, "
                   "else 1e-3)")
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--budget-slots", options->num_budget_slots,
                   "with --memory-budget tight: the state slots it holds (default 2 max-n + 4)")
      ->check(count);
  command
      ->add_option("--inject", options->inject,
                   "test-only fault: reproduce a historical state-cache bug, or resume cached prefixes from another "
                   "prefix's checkpoint (stale-checkpoint, with --shared-prefixes)")
      ->check(CLI::IsMember({"none", "decode-before-prefill", "offset-wrap", "stale-checkpoint"}))
      ->capture_default_str();
  add_reference_flags(*command, options->reference, "reference-", /*defaults_from_engine=*/true);
  command->add_option("--output", options->output_path, "write the samples as JSONL (the batch format)");
  command->add_option("--summary", options->summary_path, "write the comparison summary as JSON");
  command->add_option("--report", options->report_path, "write the comparison as an HTML report");
  engine::EngineOptions& engine = options->engine.options;
  engine.max_num_batched_tokens = 24;
  engine.max_num_seqs = 16;
  options->engine.tight_budget = true;
  engine.slot_policy = engine::SlotPolicy::Highest;
  options->engine.add_to(*command, /*allow_tight_budget=*/true);
  command->get_option("--max-model-len")
      ->description("prompt plus generated tokens of one sequence (default: max-prompt-tokens + max-new-tokens)");
  command->callback([options, command] {
    if (options->workload.min_samples > options->workload.max_samples)
      throw UsageError(fmt::format("--min-n {} is more than --max-n {}", options->workload.min_samples,
                                   options->workload.max_samples));
    // The reference keeps an fp32 state: against it a bf16 state's rounding moves logprobs by up to ~0.2 (demo
    // model), far past the default threshold, while a stale or wrapped state still moves them by O(1).
    const engine::BackendChoice& engine_backend = options->engine.options.backend;
    if (engine_backend.state_dtype != DType::F32 && command->count("--threshold") == 0)
      throw UsageError(
          fmt::format("--state-dtype {} rounds the state at every step, which moves logprobs by up to ~0.2 against "
                      "the fp32 reference, so --threshold {:g} would flag nearly every sample: give --threshold "
                      "(0.5 still flags the injected state-cache bugs) or stress with --state-dtype f32",
                      engine::state_dtype_name(engine_backend.state_dtype), options->threshold));
    if (command->count("--reference-backend") == 0) options->reference.backend = engine_backend.kind;
    if (command->count("--reference-cuda-weights") == 0) options->reference.cuda_weights = engine_backend.cuda_weights;
    if (command->count("--reference-cuda-gemm") == 0) options->reference.cuda_gemm = engine_backend.cuda_gemm;
    if (command->count("--reference-tensor-parallel-size") == 0)
      options->reference.tensor_parallel_size = engine_backend.tensor_parallel_size;
    options->threshold = resolve_threshold(
        command->count("--threshold") > 0 ? std::optional<double>(options->threshold) : std::nullopt,
        engine::describe(engine_backend), options->reference, engine_backend);
    if (const int status = run_stress_command(*options); status != 0) throw ExitStatus{status};
  });
}

}  // namespace jambo::cli
