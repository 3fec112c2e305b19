#include "cli/common.h"

#include "engine/backend_factory.h"
#include "engine/memory_budget.h"
#include "forensics/compare.h"
#include "forensics/sequence_runner.h"
#include "forensics/reference_scorer.h"
#include "model/safetensors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <limits>

namespace jambo::cli {

void add_allow_skipped_flag(CLI::App& command, bool& allow_skipped) {
  command.add_flag("--allow-skipped", allow_skipped,
                   fmt::format("exit 0 rather than {} when malformed input lines were skipped (each is still reported "
                               "on stderr)",
                               kSkippedLinesExitCode));
}

void report_skipped_line(const std::string& path, int64_t line_number, std::string_view error) {
  fmt::print(stderr, "{}:{}: {}; line skipped\n", path, line_number, error);
}

int skipped_lines_exit_code(std::string_view command, int64_t num_skipped, bool allow_skipped) {
  if (num_skipped == 0 || allow_skipped) return 0;
  fmt::print(stderr, "{}: {} malformed input line{} skipped: exit code {} (--allow-skipped: 0)\n", command, num_skipped,
             num_skipped == 1 ? "" : "s", kSkippedLinesExitCode);
  return kSkippedLinesExitCode;
}

void ModelOptions::add_to(CLI::App& command, bool allow_random_weights) {
  command.add_option("--model", folder, "model folder (config.json, *.safetensors, tokenizer.json)")->required();
  if (!allow_random_weights) return;
  command.add_flag("--random-weights", random_weights,
                   "ignore the folder's weights: random weights with the shape of its config.json");
  command.add_option("--random-dtype", random_dtype, "dtype of random weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  command.add_option("--random-seed", random_seed, "seed of random weights")->capture_default_str();
}

model::Model ModelOptions::load(engine::BackendKind backend) const {
  if (!random_weights) return model::load_model(folder);
  model::require_model_folder(folder);
  const DType dtype = random_dtype == "f32" ? DType::F32 : random_dtype == "f16" ? DType::F16 : DType::BF16;
  const model::JambaConfig config = model::load_config(std::filesystem::path(folder) / "config.json");
  // The GPU generates random weights itself: no host copy, which a 52B model could not afford.
  if (backend == engine::BackendKind::Cuda) return describe_random_model(config, dtype, random_seed);
  return make_random_model(config, dtype, random_seed);
}

std::optional<tokenizer::Tokenizer> ModelOptions::load_tokenizer() const {
  model::require_model_folder(folder);  // before "no tokenizer": a file given for the folder has none
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::path(folder) / "tokenizer.json", error)) return std::nullopt;
  return tokenizer::Tokenizer::load(folder);
}

std::ifstream open_input_file(const std::string& path) {
  std::error_code error;
  JAMBO_REQUIRE(std::filesystem::is_regular_file(path, error),
                "input file '{}' does not exist or is not a regular file", path);
  std::ifstream file(path);
  JAMBO_REQUIRE(file, "cannot open input file '{}'", path);
  return file;
}

std::ofstream open_output(const std::string& path) {
  std::ofstream file;
  if (path.empty()) return file;
  file.open(path);
  JAMBO_REQUIRE(file, "cannot write output file '{}'", path);
  return file;
}

void write_output(std::ofstream& file, const std::string& path, const std::string& text) {
  file << text;
  file.close();
  JAMBO_REQUIRE(file, "cannot write output file '{}'", path);
}

namespace {

// Binds a flag to a typed value: its text is parsed once, here, and a value `parse` refuses (jambo::Error) is a
// usage error naming the flag. `choices`, the valid spellings, are shown in the help.
template <typename T, typename Parse>
CLI::Option* add_parsed_option(CLI::App& command, const std::string& flag, T& value, Parse parse,
                               const std::string& help, const std::vector<std::string_view>& choices = {}) {
  CLI::Option* option = command.add_option_function<std::string>(
      flag,
      [&value, parse, flag](const std::string& text) {
        try {
          value = parse(text);
        } catch (const Error& error) {
          throw CLI::ValidationError(flag, error.what());
        }
      },
      help);
  if (!choices.empty()) option->type_name(fmt::format("{{{}}}", fmt::join(choices, ",")));
  return option;
}

CLI::Option* add_backend_option(CLI::App& command, const std::string& flag, engine::BackendKind& backend,
                                const std::string& help) {
  return add_parsed_option(command, flag, backend, engine::parse_backend_kind, help, engine::backend_names());
}

CLI::Option* add_cuda_weights_option(CLI::App& command, const std::string& flag, engine::CudaWeights& weights,
                                     const std::string& help) {
  return add_parsed_option(command, flag, weights, engine::parse_cuda_weights, help, engine::cuda_weights_names());
}

CLI::Option* add_cuda_gemm_option(CLI::App& command, const std::string& flag, engine::CudaGemm& gemm,
                                  const std::string& help) {
  return add_parsed_option(command, flag, gemm, engine::parse_cuda_gemm, help, engine::cuda_gemm_names());
}

constexpr const char* kCudaGemmHelp =
    "the GPU's GEMMs: invariant (one summation order for every batch size: a request's tokens and logprobs do not "
    "depend on its batch, docs/DESIGN.md: GPU invariance), or cublas (faster at most batch sizes, NOT invariant: "
    "logprobs move with the batch, and the forensics cannot hold it to threshold 0)";

CLI::Option* add_tensor_parallel_option(CLI::App& command, const std::string& flag, int64_t& size,
                                        const std::string& help) {
  return command.add_option(flag, size, help)->check(CLI::Range(int64_t(1), int64_t(1024)));
}

}  // namespace

void add_backend_flags(CLI::App& command, engine::BackendChoice& choice) {
  add_backend_option(command, "--backend", choice.kind, "compute backend")->default_str(std::string(name(choice.kind)));
  add_cuda_weights_option(command, "--cuda-weights", choice.cuda_weights,
                          "weights on the GPU: f32 (upcast, exact against the CPU), bf16 (as stored, faster) or f16 "
                          "(converted to IEEE half)")
      ->default_str(std::string(name(choice.cuda_weights)));
  add_cuda_gemm_option(command, "--cuda-gemm", choice.cuda_gemm, kCudaGemmHelp)
      ->default_str(std::string(name(choice.cuda_gemm)));
  add_parsed_option(command, "--state-dtype", choice.state_dtype, engine::parse_state_dtype,
                    "recurrent-state storage (conv tails and SSM states): f32, or bf16 (half the memory, rounded "
                    "on every store, so chunk boundaries then move logprobs slightly; computed in fp32 either way)",
                    engine::state_dtype_names())
      ->default_str(std::string(engine::state_dtype_name(choice.state_dtype)));
  add_tensor_parallel_option(command, "--tensor-parallel-size", choice.tensor_parallel_size,
                             "split the model over N ranks, Megatron-style (docs/DESIGN.md: tensor parallelism): N "
                             "threads of this process on the CPU backend, GPUs 0..N-1 over NCCL on CUDA")
      ->capture_default_str();
}

SingleSequenceBackend make_single_sequence_backend(const model::Model& model, int64_t max_tokens,
                                                   const engine::BackendChoice& choice) {
  backend::CacheConfig cache = forensics::single_sequence_cache(max_tokens);
  cache.state_dtype = choice.state_dtype;
  return {make_backend(choice, model, cache), cache};
}

double resolve_threshold(std::optional<double> given, const std::optional<std::string>& samples_backend,
                         const forensics::ReferenceOptions& reference,
                         const std::optional<engine::BackendChoice>& engine) {
  const engine::BackendChoice reference_choice{reference.backend, reference.cuda_weights, reference.cuda_gemm,
                                               DType::F32,  // the reference keeps an fp32 state
                                               reference.tensor_parallel_size};
  const std::optional<std::string> reference_reason = engine::why_not_bitwise(reference_choice);
  if (!given) {
    const bool own = samples_backend && *samples_backend == engine::describe(reference_choice);
    return own && !reference_reason ? 0.0 : forensics::kDefaultCompareThreshold;
  }
  if (*given == 0.0) {
    if (reference_reason)
      throw UsageError(fmt::format("--threshold 0 asks the reference for its logprobs bit for bit, but it runs on {}: {}",
                                   engine::describe(reference_choice), *reference_reason));
    if (const std::optional<std::string> engine_reason = engine ? engine::why_not_bitwise(*engine) : std::nullopt)
      throw UsageError(fmt::format("--threshold 0 asks the engine for its logprobs bit for bit, but it runs on {}: {}",
                                   engine::describe(*engine), *engine_reason));
    if (engine && engine->tensor_parallel_size != reference.tensor_parallel_size)
      throw UsageError(fmt::format("--threshold 0 asks the engine and the reference for the same bits, but the engine "
                                   "splits the model over {} tensor-parallel ranks and the reference over {}, which "
                                   "sum each row-parallel matrix's partial sums in another order",
                                   engine->tensor_parallel_size, reference.tensor_parallel_size));
  }
  return *given;
}

void add_reference_flags(CLI::App& command, forensics::ReferenceOptions& reference, const std::string& prefix,
                         bool defaults_from_engine) {
  const std::string engine_default = defaults_from_engine ? " (default: the engine's)" : "";
  CLI::Option* backend = add_backend_option(command, "--" + prefix + "backend", reference.backend,
                                            "backend that re-scores the samples" + engine_default);
  CLI::Option* weights =
      add_cuda_weights_option(command, "--" + prefix + "cuda-weights", reference.cuda_weights,
                              "its weights on the GPU: f32 (exact against the CPU), bf16 or f16" + engine_default);
  CLI::Option* gemm =
      add_cuda_gemm_option(command, "--" + prefix + "cuda-gemm", reference.cuda_gemm, kCudaGemmHelp + engine_default);
  CLI::Option* ranks = add_tensor_parallel_option(
      command, "--" + prefix + "tensor-parallel-size", reference.tensor_parallel_size,
      "ranks it splits the model over (docs/DESIGN.md: tensor parallelism); the engine's split gives the engine's "
      "bits" + engine_default);
  if (!defaults_from_engine) {
    backend->default_str(std::string(name(reference.backend)));
    weights->default_str(std::string(name(reference.cuda_weights)));
    gemm->default_str(std::string(name(reference.cuda_gemm)));
    ranks->capture_default_str();
  }
  command
      .add_option("--" + prefix + "step-tokens", reference.max_step_tokens,
                  "tokens of one reference step (samples are packed into steps; a longer one runs alone)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->capture_default_str();
  command
      .add_option("--" + prefix + "step-rows", reference.max_step_rows,
                  "samples of one reference step (the state slots its backend holds)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16))
      ->capture_default_str();
}

void add_request_flags(CLI::App& command, engine::RequestSpec& request) {
  command.add_option("--max-tokens", request.stop.max_tokens, "tokens to generate at most")->capture_default_str();
  command.add_option("--temperature", request.sampling.temperature, "0 is greedy")->capture_default_str();
  command.add_option("--top-k", request.sampling.top_k, "sample among the K most likely (0: all)");
  command.add_option("--top-p", request.sampling.top_p, "sample within probability mass P");
  command.add_option("--min-p", request.sampling.min_p, "drop tokens below min_p times the top probability");
  command.add_option("--seed", request.sampling.seed, "seed for reproducible sampling")->check(CLI::NonNegativeNumber);
  command.add_option("--stop", request.stop.strings,
                     "stop before this text (repeatable; needs the model's tokenizer); not part of the output");
  command.add_flag("--ignore-eos", request.stop.ignore_eos, "generate max_tokens tokens even past EOS (benchmarks)");
}

void validate_request_flags(const engine::RequestSpec& request) {
  engine::RequestSpec flags = request;
  flags.prompt_ids = {0};
  const engine::RequestLimits any{/*vocab_size=*/1, /*max_model_len=*/std::numeric_limits<int64_t>::max() / 2,
                                  /*max_n=*/int64_t(1) << 20, /*has_tokenizer=*/true};
  if (const std::optional<engine::FieldError> error = validate(flags, any)) {
    std::string flag = error->field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    throw UsageError(fmt::format("--{}: {}", flag, error->message));
  }
}

void EngineFlags::add_to(CLI::App& command, bool allow_tight_budget) {
  add_backend_flags(command, options.backend);
  command.add_option("--max-num-batched-tokens", options.max_num_batched_tokens, "tokens of all rows of one step")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->capture_default_str();
  command.add_option("--max-num-seqs", options.max_num_seqs, "sequences running at once")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  const auto parse_budget = [this, allow_tight_budget](const std::string& text) {
    tight_budget = allow_tight_budget && text == "tight";
    return tight_budget ? options.memory_budget : engine::parse_memory_budget(text);
  };
  add_parsed_option(command, "--memory-budget", options.memory_budget, parse_budget,
                    "bytes (8e9, 2GiB) or a fraction of available memory for weights, state slots and KV cache")
      ->default_str(tight_budget ? "tight" : to_string(options.memory_budget));
  command.add_option("--kv-block-size", options.kv_block_size, "tokens per KV block")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16))
      ->capture_default_str();
  command
      .add_option("--max-model-len", options.max_model_len,
                  fmt::format("prompt plus generated tokens of one sequence, at most the model's "
                              "max_position_embeddings (default: the smaller of that and {})",
                              engine::kDefaultMaxModelLen))
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  add_parsed_option(command, "--slot-policy", options.slot_policy, engine::parse_slot_policy,
                    "which free state slot a request gets", engine::slot_policy_names())
      ->default_str(std::string(name(options.slot_policy)));
  command.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", options.enable_prefix_caching,
                   "reuse the KV blocks and recurrent-state checkpoints of prompts seen before (CPU backend)")
      ->default_str("on");
  command
      .add_option("--max-num-checkpoints", options.max_num_checkpoints,
                  "recurrent-state checkpoints of cached prefixes, each the size of a state slot, taken from the "
                  "memory budget before the KV blocks (default: up to 2 x max-num-seqs from what the KV blocks leave)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  command.add_flag("--check", options.checked,
                   "verify slot and checkpoint owner and generation of every row; poison freed slots and checkpoints");
  command.add_option("--trace", options.trace_path, "write a JSONL trace of every step and lifecycle event");
  command
      .add_option("--weight-version", options.weight_version,
                  "the name of the weights, in every output's weight_versions (GET /weight_version)")
      ->check([](const std::string& text) { return text.empty() ? "must not be empty" : ""; })
      ->capture_default_str();
}

std::string describe_prefix_cache(const engine::EngineCounters& counters, const std::string& status) {
  if (!counters.prefix_caching) return "prefix caching " + status;
  const engine::PrefixCacheCounters& cache = counters.prefix_cache;
  std::string misses;
  for (int reason = 0; reason < engine::kNumPrefixMisses; ++reason)
    misses += fmt::format("{}{} {}", reason == 0 ? "" : ", ", name(engine::PrefixMiss(reason)), cache.misses[reason]);
  return fmt::format("prefix cache: {:.1f}% of {} prompt tokens resumed (misses: {}; {} checkpoints evicted)",
                     cache.query_tokens == 0 ? 0.0 : 100.0 * double(cache.hit_tokens) / double(cache.query_tokens),
                     cache.query_tokens, misses, cache.checkpoint_evictions);
}

}  // namespace jambo::cli
