// A step's outputs from its logits on the GPU (backend.h: target logprobs with top-K, token choices, copies
// asked for): builds the work items of the logits kernels (logits_ops.h), runs them, brings back the small
// results in one transfer and assembles the StepOutput. Choices the kernels cannot make (a top_k or
// nucleus wider than kMaxCandidates) are made on the host from that one vector by the CPU twin, their logprobs
// taken against the GPU's normalizer of the vector, so that a token has one logprob whichever side chose it.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/logits_ops.h"

#include <span>
#include <vector>

namespace jambo::backend::cuda {

class LogitsOutputs {
 public:
  // logits: the rows' computed vectors in row order (computes_all_vectors(row) ? num_tokens : 1 each).
  void compute(std::span<const BatchRow> rows,
               const float* logits,  // [num_vectors, V] on the GPU
               int64_t vocab_size, cudaStream_t stream, StepOutput& output);

 private:
  struct ChoiceWork {  // where each choice's answer comes from
    int32_t vector = 0;
    int32_t top_request = -1;     // its sorted candidates (top-K and sampling), or -1
    int32_t sample_request = -1;  // its sampled token, or -1 (greedy: the vector's argmax)
    bool on_host = false;         // chosen by the CPU twin from the downloaded vector
  };

  void plan(std::span<const BatchRow> rows, int64_t vocab_size);
  int32_t add_top_request(int32_t vector, int64_t count);
  void run_kernels(const float* logits, int64_t vocab_size, cudaStream_t stream);
  std::vector<TokenLogprob> top_of(int32_t top_request, int64_t count, double log_normalizer) const;
  std::vector<float> download_vector(const float* logits, int32_t vector, int64_t vocab_size,
                                     cudaStream_t stream) const;
  void assemble(std::span<const BatchRow> rows, const float* logits, int64_t vocab_size, cudaStream_t stream,
                StepOutput& output) const;

  // The step's plan, rebuilt by each compute().
  std::vector<int64_t> first_vector_;                      // [num_rows]
  std::vector<int32_t> targets_;                           // [num_vectors] -1: none
  std::vector<TopRequest> top_requests_;                   // [num_top]
  std::vector<SampleRequest> sample_requests_;             // [num_samples]
  std::vector<std::vector<int32_t>> target_top_requests_;  // [num_rows][targets] (empty without top-K)
  std::vector<std::vector<ChoiceWork>> choice_work_;       // [num_rows][choices]
  int64_t num_candidates_ = 0;

  // The kernels' results, back on the host.
  std::vector<VectorStats> stats_;            // [num_vectors]
  std::vector<int32_t> candidate_ids_;        // [num_candidates_]
  std::vector<float> candidate_logits_;       // [num_candidates_]
  std::vector<SampleResult> sample_results_;  // [num_samples]

  PinnedBuffer<std::byte> pinned_;  // staging of both transfers
  DeviceBuffer<std::byte> device_;
};

}  // namespace jambo::backend::cuda
