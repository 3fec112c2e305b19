#include "backend/cuda/device_math.cuh"
#include "backend/cuda/embedding_norm.h"

#include <algorithm>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;

// A norm block holds its row in registers, up to kNormValuesPerThread values a thread, so that every load of the
// row is in flight at once and the row is read once. Threads: about four values each, so that a decode step's
// single row takes a short chain (H200, 3B shape, ncu, a 2560-wide add + norm: one row 10.4 us with 256 threads
// and two passes over the row, 5.1-5.7 with 1024, 4.8-5.0 with 640 in registers; 256 rows 6.4 us, then 5.7).
constexpr int kNormValuesPerThread = 8;
constexpr int64_t kMaxNormWidth = int64_t(kNormValuesPerThread) * 1024;

unsigned norm_threads(int64_t n) {
  require(n <= kMaxNormWidth, "the CUDA RMSNorm takes rows of up to " + std::to_string(kMaxNormWidth) +
                                  " values, got " + std::to_string(n));
  return unsigned(std::clamp<int64_t>((n + 4 * kWarpSize - 1) / (4 * kWarpSize) * kWarpSize, kWarpSize, 1024));
}

// A row's values as the block holds them: thread i has entries i, i + blockDim.x, ...; zeros past the row's end.
struct RowValues {
  float values[kNormValuesPerThread];

  __device__ static int64_t entry(int j) { return threadIdx.x + int64_t(j) * blockDim.x; }

  template <typename Load>  // Load: float(int64_t i), called for each entry i < n
  __device__ static RowValues load(int64_t n, Load load) {
    RowValues row;
#pragma unroll
    for (int j = 0; j < kNormValuesPerThread; ++j) row.values[j] = entry(j) < n ? load(entry(j)) : 0.0f;
    return row;
  }

  template <typename Visit>  // Visit: void(int64_t i, float value), called for each entry i < n
  __device__ void for_each(int64_t n, Visit visit) const {
#pragma unroll
    for (int j = 0; j < kNormValuesPerThread; ++j) {
      if (entry(j) >= n) break;  // entries rise with j
      visit(entry(j), values[j]);
    }
  }
};

__global__ void gather_rows_kernel(const float* table,      // [any, W]
                                   const int32_t* indices,  // [R]
                                   int64_t num_rows, int64_t width,
                                   float* out) {  // [R, W]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(num_rows, width)) return;
  const int64_t r = i / width, w = i % width;
  out[i] = table[device_offset(indices[r], width) + w];
}

// One block per row: out = weight * x * rsqrt(mean(x^2) + eps), as vector_ops.cpp (1 / sqrt, not rsqrtf); row
// `row` of out16 gets the same values rounded, when it is present.
__device__ void normalize_row(const RowValues& x,  // [n]
                              int64_t n,
                              const float* weight,  // [n]
                              float eps,
                              float* out,                            // [n], or null
                              const Narrow16& out16, int64_t row) {  // [rows, n]
  __shared__ float scratch[kWarpSize];
  float sum_of_squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormValuesPerThread; ++j) sum_of_squares += x.values[j] * x.values[j];
  sum_of_squares = block_sum(sum_of_squares, scratch);
  const float inverse_rms = 1.0f / sqrtf(sum_of_squares / float(n) + eps);
  x.for_each(n, [&](int64_t i, float x_i) {
    const float value = weight[i] * (x_i * inverse_rms);
    if (out != nullptr) out[i] = value;
    if (out16.present()) store_narrow(out16, device_offset(row, n) + i, value);
  });
}

__global__ void rms_norm_kernel(const float* x,  // [num_rows, x_stride]
                                int64_t x_stride, int64_t n,
                                const float* weight,  // [n]
                                float eps,
                                float* out,  // [num_rows, out_stride]
                                int64_t out_stride,
                                Narrow16 out16) {  // [num_rows, n] or absent
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const int64_t row = blockIdx.x;
  const float* in = x + device_offset(row, x_stride);
  normalize_row(RowValues::load(n, [&](int64_t i) { return in[i]; }), n, weight, eps,
                out == nullptr ? nullptr : out + device_offset(row, out_stride), out16, row);
}

struct NormSegments {
  NormSegment segments[kMaxNormSegments];
};

// One block per (row, segment).
__global__ void rms_norm_segments_kernel(float* x,  // [num_rows, x_stride]
                                         int64_t x_stride, NormSegments segments, float eps) {
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const NormSegment& segment = segments.segments[blockIdx.y];
  float* row = x + device_offset(blockIdx.x, x_stride) + segment.column;
  normalize_row(RowValues::load(segment.width, [&](int64_t i) { return row[i]; }), segment.width, segment.weight, eps,
                row, segment.out16, blockIdx.x);
}

__global__ void add_rms_norm_kernel(float* hidden,        // [num_rows, n]
                                    const float* update,  // [num_rows, n]
                                    int64_t n,
                                    const float* weight,  // [n] or null
                                    float eps,
                                    float* normed,        // [num_rows, n]
                                    Narrow16 normed16) {  // [num_rows, n] or absent
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const int64_t first = device_offset(blockIdx.x, n);
  const RowValues sum = RowValues::load(n, [&](int64_t i) { return hidden[first + i] + update[first + i]; });
  sum.for_each(n, [&](int64_t i, float sum_i) { hidden[first + i] = sum_i; });
  if (weight != nullptr)
    normalize_row(sum, n, weight, eps, normed == nullptr ? nullptr : normed + first, normed16, blockIdx.x);
}

__global__ void gather_rms_norm_kernel(const int64_t* selected,  // [num_vectors]
                                       const float* hidden,      // [T, H]
                                       int64_t hidden_size,
                                       const float* weight,  // [H]
                                       float eps,
                                       float* out,        // [num_vectors, H]
                                       Narrow16 out16) {  // [num_vectors, H] or absent
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const int64_t v = blockIdx.x;
  const float* in = hidden + device_offset(selected[v], hidden_size);
  normalize_row(RowValues::load(hidden_size, [&](int64_t i) { return in[i]; }), hidden_size, weight, eps,
                out + device_offset(v, hidden_size), out16, v);
}

__global__ void add_bias_kernel(float* y,  // [num_rows, n]
                                int64_t num_rows, int64_t n,
                                const float* bias) {  // [n]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < device_offset(num_rows, n)) y[i] += bias[i % n];
}

}  // namespace

void gather_rows(const float* table, const int32_t* indices, int64_t num_rows, int64_t width, float* out,
                 cudaStream_t stream) {
  const int64_t count = device_offset(num_rows, width);
  if (count == 0) return;
  gather_rows_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(table, indices, num_rows, width, out);
  JAMBO_CUDA_CHECK_LAUNCH(gather_rows_kernel);
}

void rms_norm(const float* x, int64_t x_stride, int64_t num_rows, int64_t n, const float* weight, float eps, float* out,
              int64_t out_stride, cudaStream_t stream, Narrow16 out16) {
  if (num_rows == 0) return;
  launch_early(rms_norm_kernel, dim3(unsigned(num_rows)), dim3(norm_threads(n)), 0, stream, x, x_stride, n, weight, eps,
               out, out_stride, out16);
}

void rms_norm_segments(float* x, int64_t x_stride, int64_t num_rows, std::span<const NormSegment> segments, float eps,
                       cudaStream_t stream) {
  require(segments.size() <= size_t(kMaxNormSegments),
          "rms_norm_segments takes at most " + std::to_string(kMaxNormSegments) + " segments");
  if (num_rows == 0 || segments.empty()) return;
  NormSegments packed;
  int64_t widest = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    packed.segments[s] = segments[s];
    widest = std::max(widest, segments[s].width);
  }
  launch_early(rms_norm_segments_kernel, dim3(unsigned(num_rows), unsigned(segments.size())),
               dim3(norm_threads(widest)), 0, stream, x, x_stride, packed, eps);
}

void add_rms_norm(float* hidden, const float* update, int64_t num_rows, int64_t n, const float* weight, float eps,
                  float* normed, cudaStream_t stream, Narrow16 normed16) {
  if (num_rows == 0) return;
  launch_early(add_rms_norm_kernel, dim3(unsigned(num_rows)), dim3(norm_threads(n)), 0, stream, hidden, update, n,
               weight, eps, normed, normed16);
}

void gather_rms_norm(const DeviceRows& rows, const float* hidden, int64_t hidden_size, const float* weight, float eps,
                     float* out, cudaStream_t stream, Narrow16 out16) {
  if (rows.num_vectors == 0) return;
  launch_early(gather_rms_norm_kernel, dim3(unsigned(rows.num_vectors)), dim3(norm_threads(hidden_size)), 0, stream,
               rows.selected, hidden, hidden_size, weight, eps, out, out16);
}

void add_bias(float* y, int64_t num_rows, int64_t n, const float* bias, cudaStream_t stream) {
  const int64_t count = device_offset(num_rows, n);
  if (count == 0 || bias == nullptr) return;
  add_bias_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(y, num_rows, n, bias);
  JAMBO_CUDA_CHECK_LAUNCH(add_bias_kernel);
}

}  // namespace jambo::backend::cuda
