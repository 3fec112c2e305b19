// Row gather (the embedding lookup, the MoE gather), RMSNorm (alone, fused with the residual add, and over
// the tokens whose logits are asked for) and the bias add: the per-token ops between GEMMs (spec §3.3). Each is
// row-invariant: a block per row whose threads and sums follow from the width alone (InvarianceTest).
#pragma once

#include "backend/cuda/device_rows.h"
#include "backend/cuda/narrow16.h"

#include <span>

namespace jambo::backend::cuda {

// out[r] = table[indices[r]]: the embedding lookup (indices = tokens) and the MoE gather of routed tokens.
void gather_rows(const float* table,      // [any, W]
                 const int32_t* indices,  // [R]
                 int64_t num_rows, int64_t width,
                 float* out,  // [R, W]
                 cudaStream_t stream);

// out[t, :n] = weight * x[t, :n] / sqrt(mean(x[t, :n]^2) + eps) for t < num_rows; rows are strided so that a
// column slice of a wider matrix can be normalized in place of a copy. out16, when present, gets the same
// values rounded ([num_rows, n], for the GEMMs the output feeds), as do the norms' outputs below.
void rms_norm(const float* x,  // [num_rows, x_stride], the first n columns read
              int64_t x_stride, int64_t num_rows, int64_t n,
              const float* weight,  // [n]
              float eps,
              float* out,  // [num_rows, out_stride], the first n columns written; or null where out16 suffices
              int64_t out_stride, cudaStream_t stream, Narrow16 out16 = {});

// Several norms over column ranges of one matrix, in place and in one launch: segment s normalizes columns
// [column, column + width) of every row with its own weight (Mamba's dt, B and C norms of x_proj's output).
struct NormSegment {
  int64_t column = 0, width = 0;
  const float* weight = nullptr;  // [width]
  Narrow16 out16;                 // [num_rows, width], or absent
};
constexpr int kMaxNormSegments = 3;

void rms_norm_segments(float* x,  // [num_rows, x_stride]
                       int64_t x_stride, int64_t num_rows,
                       std::span<const NormSegment> segments,  // at most kMaxNormSegments
                       float eps, cudaStream_t stream);

// hidden += update; then, when weight is not null, normed = rms_norm(hidden) (the residual add and the
// next sub-layer's pre-norm in one pass).
void add_rms_norm(float* hidden,        // [num_rows, n]
                  const float* update,  // [num_rows, n]
                  int64_t num_rows, int64_t n,
                  const float* weight,  // [n] or null: the add alone
                  float eps,
                  float* normed,  // [num_rows, n] (unused without weight), or null where normed16 suffices
                  cudaStream_t stream, Narrow16 normed16 = {});

// out[v] = rms_norm(hidden[selected[v]]) for the step's logits vectors (the final norm).
void gather_rms_norm(const DeviceRows& rows,
                     const float* hidden,  // [T, H]
                     int64_t hidden_size,
                     const float* weight,  // [H]
                     float eps,
                     float* out,  // [num_vectors, H]
                     cudaStream_t stream, Narrow16 out16 = {});

// y[t, :] += bias for t < num_rows.
void add_bias(float* y,  // [num_rows, n]
              int64_t num_rows, int64_t n,
              const float* bias,  // [n]
              cudaStream_t stream);

}  // namespace jambo::backend::cuda
