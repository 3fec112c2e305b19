// Pieces every subcommand shares: usage errors (exit code 2), model loading options, JSON output.
#pragma once

#include "backend/backend.h"
#include "core/error.h"
#include "core/json.h"
#include "engine/backend_factory.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"
#include "model/weights.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace jambo::forensics {
struct ReferenceOptions;
}

namespace jambo::cli {

// Thrown by a subcommand that finished but must exit with a non-zero status (3: samples flagged, 4: input lines
// skipped).
struct ExitStatus {
  int code = 0;
};

// A bad option value found after parsing; main() reports it like a parse error (exit code 2).
class UsageError : public Error {
 public:
  using Error::Error;
};

// Malformed input lines (score, batch, compare, trace), one policy (main.cpp): each is reported and skipped, the run
// goes on, and it ends with kSkippedLinesExitCode unless --allow-skipped was given.
constexpr int kSkippedLinesExitCode = 4;
// Logits that were not finite (backend/nonfinite_logits.h), whichever command met them.
constexpr int kNonFiniteLogitsExitCode = 5;
void add_allow_skipped_flag(CLI::App& command, bool& allow_skipped);
// "FILE:LINE: what is wrong; line skipped" on stderr.
void report_skipped_line(const std::string& path, int64_t line_number, std::string_view error);
// 0 when no line was skipped or skipping was allowed, else kSkippedLinesExitCode, explained in a line on stderr.
int skipped_lines_exit_code(std::string_view command, int64_t num_skipped, bool allow_skipped);

// --model DIR, plus --random-weights to build the folder's config.json with random weights.
struct ModelOptions {
  std::string folder;
  bool random_weights = false;
  std::string random_dtype = "bf16";
  uint64_t random_seed = 0;

  void add_to(CLI::App& command, bool allow_random_weights);
  // `backend` is the one backend that will read the weights: with --random-weights and CUDA they are
  // generated on the GPU and never held on the host. Commands that also run the CPU reference path keep the CPU.
  model::Model load(engine::BackendKind backend = engine::BackendKind::Cpu) const;
  // The folder's tokenizer, or nullopt when it has no tokenizer.json.
  std::optional<tokenizer::Tokenizer> load_tokenizer() const;
};

// Opens a regular file for reading; errors name the path (missing, a directory, unreadable).
std::ifstream open_input_file(const std::string& path);

// Opens an output file (none for an empty path) before the long part of a run, so that an unwritable path fails
// at once; write_output writes the text and closes it, both naming the path on failure.
std::ofstream open_output(const std::string& path);
void write_output(std::ofstream& file, const std::string& path, const std::string& text);

// --backend (cpu or cuda), --cuda-weights (f32, bf16 or f16) and --state-dtype (f32 or bf16), parsed into
// `choice` as they are read (a bad value is a usage error naming the flag); its values on entry are the defaults.
void add_backend_flags(CLI::App& command, engine::BackendChoice& choice);

// A backend with one state slot and room for max_tokens tokens of KV cache.
struct SingleSequenceBackend {
  std::unique_ptr<backend::Backend> backend;
  backend::CacheConfig cache;
};
SingleSequenceBackend make_single_sequence_backend(const model::Model& model, int64_t max_tokens,
                                                   const engine::BackendChoice& choice);

void add_score_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_tokenize_commands(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_compare_command(CLI::App& app);
void add_batch_command(CLI::App& app);
void add_trace_command(CLI::App& app);
void add_stress_command(CLI::App& app);
void add_serve_command(CLI::App& app);

// The reference path's flags, each name after `prefix` ("" for compare, "reference-" for stress):
// backend, cuda-weights, step-tokens, step-rows. With defaults_from_engine the help says that backend
// and weight mode default to the engine's (the command fills them in when not given).
void add_reference_flags(CLI::App& command, forensics::ReferenceOptions& reference, const std::string& prefix,
                         bool defaults_from_engine);

// The threshold of compare and stress, given (`given`) or not: by default 0 where the samples come from the
// reference's own backend choice (`samples_backend`, in engine::describe's words; nullopt where they do not say) and
// that choice is bitwise-invariant (engine::why_not_bitwise), else forensics::kDefaultCompareThreshold. A threshold of
// 0 given for a reference that cannot be bitwise, or samples from an engine that cannot, is a UsageError saying why.
double resolve_threshold(std::optional<double> given, const std::optional<std::string>& samples_backend,
                         const forensics::ReferenceOptions& reference,
                         const std::optional<engine::BackendChoice>& engine = std::nullopt);

// The request flags of generate and batch, bound to the fields of one request: --max-tokens, --temperature, --top-k,
// --top-p, --min-p, --seed, --stop, --ignore-eos (--logprobs is each command's: they print logprobs differently).
void add_request_flags(CLI::App& command, engine::RequestSpec& request);
// Checks the flags' values against the request contract (validate, engine/request_spec.h); throws UsageError naming
// the flag. The prompt, the vocabulary and the context are checked when the request is added to the engine.
void validate_request_flags(const engine::RequestSpec& request);

// The engine's flags (--max-num-batched-tokens, --memory-budget, --slot-policy, --check, ...), parsed into typed
// EngineOptions.
struct EngineFlags {
  engine::EngineOptions options;
  // jambo stress's --memory-budget tight (its default there): sized from the workload once the model is loaded.
  bool tight_budget = false;

  // With allow_tight_budget, --memory-budget also takes "tight".
  void add_to(CLI::App& command, bool allow_tight_budget = false);
};

// The prefix cache in a summary line: "prefix cache: 41.2% of 12000 prompt tokens resumed (misses: no_checkpoint 3,
// evicted 1, below_one_block 0, weight_version 0; 5 checkpoints evicted)", or why it is off.
std::string describe_prefix_cache(const engine::EngineCounters& counters, const std::string& status);

}  // namespace jambo::cli
