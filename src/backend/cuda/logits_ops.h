// The GPU twin of backend/logits_ops.h: log-softmax statistics, the sorted top candidates of a vector and
// token choices, computed where the logits are, so that a step returns ids and logprobs rather than
// [num_vectors, V] floats. Flat work items in, flat results out; LogitsOutputs (logits_outputs.h) builds
// them from the rows and assembles the StepOutput.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace jambo::backend::cuda {

// The most candidates one top request may ask for (top_k sampling beyond it is chosen on the host).
constexpr int64_t kMaxCandidates = 1024;

struct VectorStats {
  double log_normalizer = 0.0;  // log(sum(exp(logits))), in double with the max subtracted first
  float max_logit = 0.0f;
  float target_logit = 0.0f;  // logits[target] (0 without a target)
  int32_t argmax = 0;         // the highest logit; ties go to the lower id
  int32_t num_nonfinite = 0;  // NaN or infinite logits in the vector
};

// The `count` most likely tokens of one vector, most likely first (ties: lower id), written at `offset`.
struct TopRequest {
  int64_t offset = 0;  // into the candidate arrays
  int32_t vector = 0;
  int32_t count = 0;  // 1 .. min(kMaxCandidates, V)
};

// A sampled choice (temperature > 0); greedy choices need no kernel (VectorStats::argmax).
struct SampleRequest {
  double temperature = 1.0;
  double top_p = 1.0;
  double min_p = 0.0;
  double uniform = 0.0;
  int64_t top_k = 0;  // 0 or <= the top request's count
  int32_t vector = 0;
  int32_t top_request = -1;  // its sorted candidates when top_k or top_p restricts them, else -1
};

struct SampleResult {
  int32_t token = 0;
  float logit = 0.0f;      // logits[token]
  int32_t needs_host = 0;  // the nucleus reaches past the candidates: choose on the host from the vector
};

// stats[v] of logits vector v; targets[v] < 0: no target.
void logits_stats(const float* logits,     // [num_vectors, V]
                  const int32_t* targets,  // [num_vectors]
                  int64_t num_vectors, int64_t vocab_size,
                  VectorStats* stats,  // [num_vectors]
                  cudaStream_t stream);

void top_candidates(const float* logits,         // [num_vectors, V]
                    const TopRequest* requests,  // [num_requests]
                    int64_t num_requests, int64_t vocab_size,
                    int32_t* candidate_ids,   // [sum of counts]
                    float* candidate_logits,  // [sum of counts]
                    cudaStream_t stream);

void sample_tokens(const float* logits,            // [num_vectors, V]
                   const SampleRequest* requests,  // [num_requests]
                   int64_t num_requests, int64_t vocab_size,
                   const VectorStats* stats,        // [num_vectors]
                   const TopRequest* top_requests,  // [num_top]: the candidates' requests
                   const int32_t* candidate_ids,    // [sum of counts]
                   const float* candidate_logits,   // [sum of counts]
                   SampleResult* results,           // [num_requests]
                   cudaStream_t stream);

}  // namespace jambo::backend::cuda
