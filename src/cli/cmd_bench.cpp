// jambo bench: prefill and decode speed of one sequence on the CPU backend, with the effective
// bandwidth of the weights each decode step reads and a hash of the final logits.
#include "cli/common.h"
#include "engine/sampler.h"
#include "engine/sequence_runner.h"

#include <omp.h>

#include <chrono>
#include <random>

namespace jambo::cli {
namespace {

struct BenchOptions {
  ModelOptions model;
  int64_t num_prompt_tokens = 256;
  int64_t num_decode_tokens = 32;
  int64_t num_repeats = 3;
};

int64_t view_bytes(const TensorView& view) { return view.empty() ? 0 : view.numel() * dtype_size(view.dtype); }

// Weight bytes one decode token reads: everything except the experts the router does not pick.
int64_t bytes_read_per_token(const Model& model) {
  int64_t skipped = 0;
  const int64_t num_idle = model.config.num_experts - model.config.num_experts_per_tok;
  for (const LayerWeights& layer : model.weights.layers) {
    if (layer.ffn != FfnKind::Moe) continue;
    const MlpWeights& expert = layer.moe.experts.front();
    skipped += num_idle * (view_bytes(expert.gate_proj) + view_bytes(expert.up_proj) + view_bytes(expert.down_proj));
  }
  // The embedding is a row lookup, not a full read.
  return model.weights.bytes_total - skipped - view_bytes(model.weights.embed_tokens) +
         (model.config.tie_word_embeddings ? view_bytes(model.weights.embed_tokens) : 0);
}

uint64_t fnv1a_hash(std::span<const float> values) {
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size_bytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct RunTimes {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  uint64_t logits_hash = 0;
};

// One greedy run: the prompt in one step, then num_decode single-token steps (EOS does not stop it).
RunTimes run_once(SequenceRunner& runner, std::vector<int32_t> tokens, int64_t num_decode) {
  RunTimes times;
  auto start = std::chrono::steady_clock::now();
  const StepLogits* logits = &runner.step(tokens, 0, int64_t(tokens.size()), /*all_logits=*/false);
  times.prefill_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < num_decode; ++i) {
    tokens.push_back(argmax(logits->row(0)));
    logits = &runner.step(tokens, int64_t(tokens.size()) - 1, 1, /*all_logits=*/false);
  }
  times.decode_seconds = seconds_since(start);
  times.logits_hash = fnv1a_hash(logits->row(0));
  return times;
}

void run_bench(const BenchOptions& options) {
  if (options.num_prompt_tokens < 1 || options.num_decode_tokens < 1 || options.num_repeats < 1)
    throw UsageError("--prompt-tokens, --decode-tokens and --repeats must be >= 1");
  const Model model = options.model.load();
  SingleSequenceBackend single =
      make_single_sequence_backend(model, options.num_prompt_tokens + options.num_decode_tokens);
  SequenceRunner runner(*single.backend, single.cache);
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(options.num_prompt_tokens);
  for (int32_t& token : prompt) token = int32_t(rng() % uint32_t(model.config.vocab_size));

  const double weight_gb = double(bytes_read_per_token(model)) / 1e9;
  fmt::print("model {}{}: {} layers, hidden {}, vocab {}; {:.1f} MB of weights, {:.1f} MB read per decode token; "
             "{} threads\n",
             options.model.folder, options.model.random_weights ? " (random weights)" : "",
             model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size,
             double(model.weights.bytes_total) / 1e6, weight_gb * 1e3, omp_get_max_threads());
  RunTimes best{1e30, 1e30, 0};
  for (int64_t repeat = 0; repeat < options.num_repeats; ++repeat) {
    const RunTimes times = run_once(runner, prompt, options.num_decode_tokens);
    best.prefill_seconds = std::min(best.prefill_seconds, times.prefill_seconds);
    best.decode_seconds = std::min(best.decode_seconds, times.decode_seconds);
    best.logits_hash = times.logits_hash;
  }
  const double prefill_rate = double(options.num_prompt_tokens) / best.prefill_seconds;
  const double decode_rate = double(options.num_decode_tokens) / best.decode_seconds;
  fmt::print("prefill  {:5} tokens  {:9.1f} tok/s\n", options.num_prompt_tokens, prefill_rate);
  fmt::print("decode   {:5} tokens  {:9.1f} tok/s  {:6.2f} GB/s of weights\n", options.num_decode_tokens, decode_rate,
             decode_rate * weight_gb);
  fmt::print("final logits hash {:016x} (best of {} runs)\n", best.logits_hash, options.num_repeats);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand("bench", "prefill and decode tokens/s and weight GB/s on the CPU");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  command->add_option("--prompt-tokens", options->num_prompt_tokens, "prompt length")->capture_default_str();
  command->add_option("--decode-tokens", options->num_decode_tokens, "tokens decoded")->capture_default_str();
  command->add_option("--repeats", options->num_repeats, "runs; the best is reported")->capture_default_str();
  command->callback([options] { run_bench(*options); });
}

}  // namespace jambo::cli
