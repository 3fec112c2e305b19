// jambo bench: prefill and decode speed of N sequences decoding together (one row each per decode step) on a
// backend, straight through the backend's forward, with the bandwidth of the weights each decode step reads,
// a hash of the final logits and, on the GPU, the copy ceiling measured in the same run.
#include "backend/nonfinite_logits.h"
#include "engine/backend_factory.h"
#include "cli/common.h"
#include "forensics/svg_plot.h"
#ifdef JAMBO_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string_view>

namespace jambo::cli {
namespace {

constexpr double kH200BandwidthGbPerS = 4800.0;  // the H200's datasheet HBM3e bandwidth
constexpr int64_t kKvBlockSize = 16;
constexpr int64_t kCopyCeilingBytes = int64_t(2) << 30;

struct BenchOptions {
  ModelOptions model;
  engine::BackendChoice backend{.cuda_weights = engine::CudaWeights::Bf16};
  std::vector<int64_t> batches = {1};  // each a run of that many sequences decoding together
  int64_t num_prompt_tokens = 256;
  int64_t num_decode_tokens = 32;
  int64_t num_repeats = 3;
  int64_t max_step_tokens = 8192;  // tokens of one prefill step (prompts are packed, long ones chunked)
  std::string profile = "none";    // the steps GPU profilers capture: none, prefill or decode
  std::string plot_path;           // an SVG of decode tok/s by batch, when set
};

int64_t view_bytes(const TensorView& view) { return view.empty() ? 0 : view.numel() * dtype_size(view.dtype); }

bool has_experts(const model::Model& model) {
  return std::ranges::any_of(model.weights.layers,
                             [](const model::LayerWeights& layer) { return layer.ffn == model::FfnKind::Moe; });
}

// Checkpoint bytes one decode step of `batch` sequences reads: everything except the embedding (a row lookup) and,
// in a MoE layer, the experts no sequence picks. Each sequence picks k of E experts, so with uniform routing
// E * (1 - (1 - k/E)^batch) experts are expected to be picked: exactly k at batch 1, an estimate beyond.
double bytes_read_per_step(const model::Model& model, int64_t batch) {
  const double num_experts = double(model.config.num_experts);
  const double num_picked =
      num_experts * (1.0 - std::pow(1.0 - double(model.config.num_experts_per_tok) / num_experts, double(batch)));
  double skipped = 0;
  for (const model::LayerWeights& layer : model.weights.layers) {
    if (layer.ffn != model::FfnKind::Moe) continue;
    const model::MlpWeights& expert = layer.moe.experts.front();
    skipped += (num_experts - num_picked) *
               double(view_bytes(expert.gate_proj) + view_bytes(expert.up_proj) + view_bytes(expert.down_proj));
  }
  const int64_t embedding_read = model.config.tie_word_embeddings ? view_bytes(model.weights.embed_tokens) : 0;
  return double(model.weights.bytes_total - view_bytes(model.weights.embed_tokens) + embedding_read) - skipped;
}

// What the backend reads of that: the CUDA backend's f32 mode holds a 16-bit checkpoint upcast, at twice its bytes.
double backend_bytes_read_per_step(const model::Model& model, const BenchOptions& options, int64_t batch) {
  const bool widened = options.backend.kind == engine::BackendKind::Cuda &&
                       options.backend.cuda_weights == engine::CudaWeights::F32 &&
                       model.weights.lm_head.dtype != DType::F32;
  return bytes_read_per_step(model, batch) * (widened ? 2 : 1);
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
  double decode_seconds = 0;      // forward calls only (each returns its greedy tokens on the host)
  double decode_gpu_seconds = 0;  // of which the GPU spent in the layers (CUDA backend; 0 otherwise)
  uint64_t logits_hash = 0;       // of the last row's final logits
};

// The batch's sequences: sequence i owns slot i and a contiguous range of KV blocks.
class BatchBench {
 public:
  BatchBench(backend::Backend& backend, const BenchOptions& options, int64_t max_batch, int64_t vocab_size)
      : backend_(backend), options_(options), blocks_per_sequence_(blocks_per_sequence(options)) {
    std::mt19937 rng(1234);
    prompts_.resize(size_t(max_batch));
    for (auto& prompt : prompts_) {
      prompt.resize(size_t(options.num_prompt_tokens));
      for (int32_t& token : prompt) token = int32_t(rng() % uint32_t(vocab_size));
    }
    tables_.resize(size_t(max_batch));
    for (int64_t s = 0; s < max_batch; ++s)
      for (int64_t b = 0; b < blocks_per_sequence_; ++b) tables_[s].push_back(int32_t(s * blocks_per_sequence_ + b));
  }

  static int64_t blocks_per_sequence(const BenchOptions& options) {
    return backend::kv_blocks_for(options.num_prompt_tokens + options.num_decode_tokens, kKvBlockSize);
  }

  // Prefill of the first `batch` prompts from zero state, then num_decode greedy steps of one token per
  // sequence (EOS does not stop them).
  RunTimes run(int64_t batch) {
    RunTimes times;
    std::vector<std::vector<int32_t>> tokens(prompts_.begin(), prompts_.begin() + batch);
    std::vector<backend::BatchRow> rows;
    int64_t step_tokens = 0;
    auto flush = [&] {
      if (rows.empty()) return;
      const auto start = std::chrono::steady_clock::now();
      backend_.forward(rows, output_);
      times.prefill_seconds += seconds_since(start);
      require_finite(rows, "prefill");
      for (size_t r = 0; r < rows.size(); ++r) {
        const int64_t s = rows[r].sequence_id;
        if (rows[r].start_position + int64_t(rows[r].tokens.size()) == options_.num_prompt_tokens)
          tokens[s].push_back(output_.rows[r].chosen[0].token);
      }
      rows.clear();
      step_tokens = 0;
    };
    profiler_capture("prefill", true);
    for (int64_t s = 0; s < batch; ++s) {
      for (int64_t start = 0; start < options_.num_prompt_tokens;) {
        const int64_t length = std::min(options_.num_prompt_tokens - start, options_.max_step_tokens - step_tokens);
        rows.push_back(row(s, prompts_[s], start, length));
        step_tokens += length;
        start += length;
        if (step_tokens == options_.max_step_tokens) flush();
      }
    }
    flush();
    profiler_capture("prefill", false);
    profiler_capture("decode", true);
    for (int64_t i = 0; i < options_.num_decode_tokens; ++i) {
      for (int64_t s = 0; s < batch; ++s) rows.push_back(row(s, tokens[s], int64_t(tokens[s].size()) - 1, 1));
      // The hash's logits, copied in the last step only: a copy every step would add its transfer to the timing.
      if (i + 1 == options_.num_decode_tokens) rows.back().copy_logits = backend::LogitsCopy::Last;
      const auto start = std::chrono::steady_clock::now();
      const double gpu_before = layers_gpu_seconds();
      backend_.forward(rows, output_);
      times.decode_seconds += seconds_since(start);
      times.decode_gpu_seconds += layers_gpu_seconds() - gpu_before;
      require_finite(rows, fmt::format("decode step {}", i));
      for (int64_t s = 0; s < batch; ++s) tokens[s].push_back(output_.rows[s].chosen[0].token);
      rows.clear();
    }
    profiler_capture("decode", false);
    times.logits_hash = fnv1a_hash(output_.logits(batch - 1));
    return times;
  }

 private:
  void require_finite(std::span<const backend::BatchRow> rows, std::string_view step) const {
    backend::require_finite_logits(
        output_, [&](size_t r) { return fmt::format("sequence {}, {}", rows[r].sequence_id, step); });
  }

  double layers_gpu_seconds() const {
#ifdef JAMBO_WITH_CUDA
    return backend::cuda::cuda_layers_gpu_seconds(backend_);
#else
    return 0.0;
#endif
  }

  // Captures the prefill steps or the decode steps.
  void profiler_capture([[maybe_unused]] std::string_view steps, [[maybe_unused]] bool on) const {
#ifdef JAMBO_WITH_CUDA
    if (options_.profile == steps) backend::cuda::cuda_profiler_capture(on);
#endif
  }

  backend::BatchRow row(int64_t sequence, std::span<const int32_t> tokens, int64_t start_position,
                        int64_t num_tokens) const {
    backend::BatchRow out =
        backend::sequence_row(sequence, tokens, start_position, num_tokens, sequence, tables_[sequence], kKvBlockSize);
    out.choices = std::span(&kGreedy, 1);
    return out;
  }

  backend::Backend& backend_;
  const BenchOptions& options_;
  int64_t blocks_per_sequence_;
  std::vector<std::vector<int32_t>> prompts_;  // [batch][num_prompt_tokens]
  std::vector<std::vector<int32_t>> tables_;   // [batch][blocks_per_sequence]
  backend::StepOutput output_;
  static constexpr backend::TokenChoice kGreedy{};
};

void run_bench(const BenchOptions& options) {
  const int64_t max_batch =
      options.batches.empty() ? 0 : *std::max_element(options.batches.begin(), options.batches.end());
  std::ofstream plot_file = open_output(options.plot_path);
  const auto load_start = std::chrono::steady_clock::now();
  const engine::BackendChoice& choice = options.backend;
  const model::Model model = options.model.load(choice.kind);
  const backend::CacheConfig cache{max_batch, max_batch * BatchBench::blocks_per_sequence(options), kKvBlockSize,
                                   choice.state_dtype};
  std::unique_ptr<backend::Backend> backend = make_backend(choice, model, cache);
  const double load_seconds = seconds_since(load_start);  // random weights: their fill, on the host or the GPU
  BatchBench bench(*backend, options, max_batch, model.config.vocab_size);

  const bool on_gpu = choice.kind == engine::BackendKind::Cuda;
  fmt::print("model {}{}: {} layers, hidden {}, vocab {}; {:.1f} MB of weights in the checkpoint\n",
             options.model.folder, options.model.random_weights ? " (random weights)" : "",
             model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size,
             double(model.weights.bytes_total) / 1e6);
  const std::string detail = (on_gpu ? fmt::format("{} weights, {} GEMMs", name(choice.cuda_weights),
                                                   name(choice.cuda_gemm))
                                     : fmt::format("{} threads", omp_get_max_threads())) +
                             fmt::format(", {} state", engine::state_dtype_name(choice.state_dtype)) +
                             (choice.tensor_parallel_size > 1
                                  ? fmt::format(", {} tensor-parallel ranks", choice.tensor_parallel_size)
                                  : "");
  const bool per_gpu = on_gpu && choice.tensor_parallel_size > 1;
  fmt::print(
      "backend {} ({}): {:.1f} MB of weights held{}, {:.1f} MB read per decode step at batch 1{}; model and caches "
      "ready in {:.1f} s\n",
      name(choice.kind), detail, double(engine::memory_share(choice, model).weight_bytes) / 1e6,
      per_gpu ? " per GPU" : "",
      backend_bytes_read_per_step(model, options, 1) / 1e6,
      has_experts(model) ? " (beyond batch 1, GB/s counts the experts uniform routing is expected to pick)" : "",
      load_seconds);
  double copy_gb_per_s = 0.0;
#ifdef JAMBO_WITH_CUDA
  if (on_gpu) {
    copy_gb_per_s = backend::cuda::cuda_copy_gb_per_s(kCopyCeilingBytes);
    fmt::print("copy ceiling: cudaMemcpy device-to-device of {:.1f} GB, {:.0f} GB/s counting bytes read plus written\n",
               double(kCopyCeilingBytes) / 1e9, copy_gb_per_s);
  }
#endif
  std::vector<forensics::svg::Bar> decode_bars;
  for (const int64_t batch : options.batches) {
    RunTimes best{1e30, 1e30, 0, 0};
    for (int64_t repeat = 0; repeat < options.num_repeats; ++repeat) {
      const RunTimes times = bench.run(batch);
      best.prefill_seconds = std::min(best.prefill_seconds, times.prefill_seconds);
      if (times.decode_seconds < best.decode_seconds) best.decode_gpu_seconds = times.decode_gpu_seconds;
      best.decode_seconds = std::min(best.decode_seconds, times.decode_seconds);
      best.logits_hash = times.logits_hash;
    }
    const double prefill_rate = double(batch * options.num_prompt_tokens) / best.prefill_seconds;
    const double step_seconds = best.decode_seconds / double(options.num_decode_tokens);
    const double decode_rate = double(batch) / step_seconds;
    const double weight_gb_per_s = backend_bytes_read_per_step(model, options, batch) / 1e9 / step_seconds;
    fmt::print("batch {:3}  prefill {:3} x {:5} tokens {:10.1f} tok/s\n", batch, batch, options.num_prompt_tokens,
               prefill_rate);
    fmt::print("batch {:3}  decode  {:3} x {:5} tokens {:10.1f} tok/s  {:8.3f} ms/step  {:7.1f} GB/s of weights", batch,
               batch, options.num_decode_tokens, decode_rate, step_seconds * 1e3, weight_gb_per_s);
    if (on_gpu)
      fmt::print(" = {:.1f}% of 4.8 TB/s (copy ceiling {:.0f} GB/s); GPU in the layers {:.3f} ms/step",
                 100.0 * weight_gb_per_s / kH200BandwidthGbPerS, copy_gb_per_s,
                 best.decode_gpu_seconds / double(options.num_decode_tokens) * 1e3);
    fmt::print("\nbatch {:3}  final logits hash {:016x} (best of {} runs)\n", batch, best.logits_hash,
               options.num_repeats);
    const std::string bandwidth =
        on_gpu ? fmt::format(", {:.0f}% of 4.8 TB/s", 100.0 * weight_gb_per_s / kH200BandwidthGbPerS) : "";
    decode_bars.push_back(
        {fmt::format("batch {}", batch), decode_rate, fmt::format("{:.0f} tok/s{}", decode_rate, bandwidth)});
  }
  if (!options.plot_path.empty()) {
    const std::string title = fmt::format("jambo bench: {} on {} ({}), {}-token prompts", options.model.folder,
                                          name(choice.kind), detail, options.num_prompt_tokens);
    write_output(
        plot_file, options.plot_path,
        forensics::svg::bar_chart(title, "sequences decoding together", "decode tokens/s in total", decode_bars));
    fmt::print("plot of decode tok/s by batch: {}\n", options.plot_path);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command =
      app.add_subcommand("bench", "prefill and decode tokens/s and weight GB/s of N sequences decoding together");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  add_backend_flags(*command, options->backend);
  command->add_option("--batch", options->batches, "sequences decoding together; a list (1,8,64) runs each in turn")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--prompt-tokens", options->num_prompt_tokens, "prompt length")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--decode-tokens", options->num_decode_tokens, "tokens decoded per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--max-step-tokens", options->max_step_tokens, "tokens of one prefill step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--repeats", options->num_repeats, "runs; the best is reported")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command
      ->add_option("--profile", options->profile,
                   "let GPU profilers (ncu --profile-from-start off) capture only the prefill or only the decode steps")
      ->check(CLI::IsMember({"none", "prefill", "decode"}))
      ->capture_default_str();
  command->add_option("--plot", options->plot_path,
                      "also write an SVG bar chart of decode tok/s by batch to this file");
  command->callback([options] { run_bench(*options); });
}

}  // namespace jambo::cli
