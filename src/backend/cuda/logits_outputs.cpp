#include "backend/cuda/logits_outputs.h"

#include "backend/logits_ops.h"
#include "core/error.h"

#include <algorithm>
#include <cstring>

namespace jambo::backend::cuda {
namespace {

// Byte offsets of consecutive arrays in one buffer, each aligned for any element type.
class Sections {
 public:
  template <typename T>
  int64_t add(int64_t count) {
    const int64_t offset = size_;
    size_ = (size_ + int64_t(sizeof(T)) * count + 15) / 16 * 16;
    return offset;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

}  // namespace

int32_t LogitsOutputs::add_top_request(int32_t vector, int64_t count) {
  TopRequest request;
  request.offset = num_candidates_;
  request.vector = vector;
  request.count = int32_t(count);
  num_candidates_ += count;
  top_requests_.push_back(request);
  return int32_t(top_requests_.size()) - 1;
}

void LogitsOutputs::plan(std::span<const BatchRow> rows, int64_t vocab_size) {
  first_vector_.clear();
  targets_.clear();
  top_requests_.clear();
  sample_requests_.clear();
  target_top_requests_.assign(rows.size(), {});
  choice_work_.assign(rows.size(), {});
  num_candidates_ = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const BatchRow& row = rows[r];
    const int32_t first = int32_t(targets_.size());
    first_vector_.push_back(first);
    targets_.resize(targets_.size() + (computes_all_vectors(row) ? row.tokens.size() : 1), -1);
    const int64_t num_top = std::min(row.num_top_logprobs, vocab_size);
    for (size_t i = 0; i < row.targets.size(); ++i) {
      targets_[first + i] = row.targets[i];
      if (num_top > 0) target_top_requests_[r].push_back(add_top_request(int32_t(first + i), num_top));
    }
    const int32_t last = int32_t(targets_.size()) - 1;
    for (const TokenChoice& choice : row.choices) {
      ChoiceWork work;
      work.vector = last;
      const bool sampled = choice.temperature > 0.0;
      const int64_t top_k = restricting_top_k(choice, vocab_size);
      const int64_t needed_for_sampling = !sampled             ? 0
                                          : top_k > 0          ? top_k
                                          : choice.top_p < 1.0 ? std::min(kMaxCandidates, vocab_size)
                                                               : 0;
      const int64_t count = std::max(needed_for_sampling, std::min(choice.num_top_logprobs, vocab_size));
      if (count > kMaxCandidates) {
        work.on_host = true;
      } else {
        if (count > 0) work.top_request = add_top_request(last, count);
        if (sampled) {
          SampleRequest request;
          request.temperature = choice.temperature;
          request.top_p = choice.top_p;
          request.min_p = choice.min_p;
          request.uniform = choice.uniform;
          request.top_k = top_k;
          request.vector = last;
          request.top_request = needed_for_sampling > 0 ? work.top_request : -1;
          work.sample_request = int32_t(sample_requests_.size());
          sample_requests_.push_back(request);
        }
      }
      choice_work_[r].push_back(work);
    }
  }
}

// One transfer of the work items up, the three kernels, one transfer of their results down.
void LogitsOutputs::run_kernels(const float* logits, int64_t vocab_size, cudaStream_t stream) {
  const int64_t num_vectors = int64_t(targets_.size());
  const int64_t num_top = int64_t(top_requests_.size()), num_samples = int64_t(sample_requests_.size());
  Sections up;
  const int64_t at_targets = up.add<int32_t>(num_vectors);
  const int64_t at_top = up.add<TopRequest>(num_top);
  const int64_t at_samples = up.add<SampleRequest>(num_samples);
  Sections down;
  const int64_t at_stats = down.add<VectorStats>(num_vectors);
  const int64_t at_ids = down.add<int32_t>(num_candidates_);
  const int64_t at_logits = down.add<float>(num_candidates_);
  const int64_t at_results = down.add<SampleResult>(num_samples);

  const int64_t num_bytes = up.size() + down.size();
  std::byte* pinned = pinned_.reserve(num_bytes);
  std::memcpy(pinned + at_targets, targets_.data(), targets_.size() * sizeof(int32_t));
  std::memcpy(pinned + at_top, top_requests_.data(), top_requests_.size() * sizeof(TopRequest));
  std::memcpy(pinned + at_samples, sample_requests_.data(), sample_requests_.size() * sizeof(SampleRequest));
  std::byte* device = device_.reserve(num_bytes);
  std::byte* results = device + up.size();
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(device, pinned, size_t(up.size()), cudaMemcpyHostToDevice, stream));

  const auto at = [](std::byte* base, int64_t offset) { return static_cast<void*>(base + offset); };
  auto* stats = static_cast<VectorStats*>(at(results, at_stats));
  auto* top = static_cast<TopRequest*>(at(device, at_top));
  auto* ids = static_cast<int32_t*>(at(results, at_ids));
  auto* candidate_logits = static_cast<float*>(at(results, at_logits));
  logits_stats(logits, static_cast<int32_t*>(at(device, at_targets)), num_vectors, vocab_size, stats, stream);
  top_candidates(logits, top, num_top, vocab_size, ids, candidate_logits, stream);
  sample_tokens(logits, static_cast<SampleRequest*>(at(device, at_samples)), num_samples, vocab_size, stats, top, ids,
                candidate_logits, static_cast<SampleResult*>(at(results, at_results)), stream);

  std::byte* host = pinned + up.size();
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(host, results, size_t(down.size()), cudaMemcpyDeviceToHost, stream));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto unpack = [&](auto& out, int64_t offset, int64_t count) {
    out.resize(size_t(count));
    std::memcpy(out.data(), host + offset, size_t(count) * sizeof(out[0]));
  };
  unpack(stats_, at_stats, num_vectors);
  unpack(candidate_ids_, at_ids, num_candidates_);
  unpack(candidate_logits_, at_logits, num_candidates_);
  unpack(sample_results_, at_results, num_samples);
}

std::vector<TokenLogprob> LogitsOutputs::top_of(int32_t top_request, int64_t count, double log_normalizer) const {
  std::vector<TokenLogprob> top;
  const TopRequest& request = top_requests_[top_request];
  for (int64_t i = 0; i < count; ++i)
    top.push_back({candidate_ids_[request.offset + i], double(candidate_logits_[request.offset + i]) - log_normalizer});
  return top;
}

std::vector<float> LogitsOutputs::download_vector(const float* logits, int32_t vector, int64_t vocab_size,
                                                  cudaStream_t stream) const {
  std::vector<float> values(static_cast<size_t>(vocab_size));
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(values.data(), logits + device_offset(vector, vocab_size),
                                   size_t(device_offset(vocab_size, sizeof(float))), cudaMemcpyDeviceToHost, stream));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
  return values;
}

void LogitsOutputs::assemble(std::span<const BatchRow> rows, const float* logits, int64_t vocab_size,
                             cudaStream_t stream, StepOutput& output) const {
  output.vocab_size = vocab_size;
  output.rows.resize(rows.size());
  output.values.clear();
  output.first_vector.clear();
  for (size_t r = 0; r < rows.size(); ++r) {
    const BatchRow& row = rows[r];
    const int64_t first = first_vector_[r];
    const int64_t num_vectors = (r + 1 < rows.size() ? first_vector_[r + 1] : int64_t(targets_.size())) - first;
    RowOutput& out = output.rows[r];
    out = RowOutput{};
    for (int64_t v = first; v < first + num_vectors; ++v) out.finite = out.finite && stats_[v].num_nonfinite == 0;
    for (size_t i = 0; i < row.targets.size(); ++i) {
      const VectorStats& stats = stats_[first + i];
      out.target_logprobs.push_back(double(stats.target_logit) - stats.log_normalizer);
      if (!target_top_requests_[r].empty())
        out.target_top_logprobs.push_back(
            top_of(target_top_requests_[r][i], std::min(row.num_top_logprobs, vocab_size), stats.log_normalizer));
    }
    for (size_t c = 0; c < row.choices.size(); ++c) {
      const TokenChoice& choice = row.choices[c];
      const ChoiceWork& work = choice_work_[r][c];
      const VectorStats& stats = stats_[work.vector];
      const bool on_host =
          work.on_host || (work.sample_request >= 0 && sample_results_[work.sample_request].needs_host);
      if (on_host) {  // logprobs against the GPU's normalizer, as every other logprob of the vector
        out.chosen.push_back(choose_token_given(download_vector(logits, work.vector, vocab_size, stream), choice,
                                                stats.log_normalizer));
        continue;
      }
      const bool sampled = work.sample_request >= 0;
      ChosenToken chosen;
      chosen.token = sampled ? sample_results_[work.sample_request].token : stats.argmax;
      const float logit = sampled ? sample_results_[work.sample_request].logit : stats.max_logit;
      chosen.logprob = double(logit) - stats.log_normalizer;
      if (choice.num_top_logprobs > 0)
        chosen.top_logprobs =
            top_of(work.top_request, std::min(choice.num_top_logprobs, vocab_size), stats.log_normalizer);
      out.chosen.push_back(std::move(chosen));
    }
    const StepOutput::CopyTarget copies = output.add_copies(row, num_vectors);
    if (copies.num_copied == 0) continue;
    JAMBO_CUDA_CHECK(cudaMemcpyAsync(copies.values, logits + device_offset(first + copies.first_computed, vocab_size),
                                     size_t(device_offset(copies.num_copied, vocab_size * int64_t(sizeof(float)))),
                                     cudaMemcpyDeviceToHost, stream));
  }
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void LogitsOutputs::compute(std::span<const BatchRow> rows, const float* logits, int64_t vocab_size,
                            cudaStream_t stream, StepOutput& output) {
  plan(rows, vocab_size);
  run_kernels(logits, vocab_size, stream);
  assemble(rows, logits, vocab_size, stream, output);
}

}  // namespace jambo::backend::cuda
