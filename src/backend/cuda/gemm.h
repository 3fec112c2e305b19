// Dense GEMMs: y = x · wᵀ with w in nn.Linear layout, all row-major. fp32 weights run as fp32 cuBLAS GEMMs;
// 16-bit weights (bf16 mode) run with the activations rounded to the weight's 16-bit type at the GEMM input,
// fp32 accumulation and fp32 output: as cublasGemmEx on a narrowed copy of x, or, for a row or two (decode), as
// skinny_gemm, which rounds x as it reads it. Why round the input rather than keep it fp32:
// cuBLAS and the tensor cores take both operands in one type, so an fp32 input would need the weights upcast
// (the f32 mode: twice the bytes, and decode is bandwidth-bound) or a custom mixed-type kernel; the rounding
// reads T*K fp32 and writes T*K bf16, nothing beside the N*K weights (N >= 1000 here), and everything outside
// the GEMMs (residual stream, norms, scan, state) stays fp32. Its one cost is a launch per GEMM (about 2 us at
// decode): fusing it into the producing norm or activation is the next step.
#pragma once

#include "backend/cuda/device_weights.h"
#include "backend/cuda/mamba_kernels.h"
#include "backend/cuda/narrow16.h"

#include <cublas_v2.h>

#include <cstddef>

namespace jambo::cuda {

// The cuBLAS handle bound to a stream, and the scratch that holds a GEMM's input rounded to 16 bits.
class Gemm {
 public:
  // pedantic: TF32 and other reduced-precision shortcuts off (the f32 mode must agree with the CPU backend
  // to 1e-4 on logprobs); the bf16 mode leaves cuBLAS its default math.
  Gemm(cudaStream_t stream, bool pedantic);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  cublasHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }
  uint16_t* narrow_input(int64_t num_elements) { return narrow_input_.reserve(num_elements); }

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer<uint16_t> narrow_input_;  // [rows, K] x in the weight's 16-bit type
  DeviceBuffer<std::byte> workspace_;    // cuBLAS's own, set once: a captured GEMM must not allocate
};

// 16-bit weights with at most this many rows of x run as skinny_gemm (skinny_gemm.h) rather than cuBLAS.
constexpr int64_t kMaxSkinnyGemmRows = 2;

// y[m, n] = sum_k x[m, k] * w[n, k] for m < num_rows. x16: x already rounded by its producer, used where its
// type is the weight's (else the GEMM rounds x itself).
void linear(Gemm& gemm,
            const float* x,  // [num_rows, w.cols]
            int64_t num_rows,
            const DeviceMatrix& w,  // [N, K]
            float* y,               // [num_rows, w.rows]
            const Narrow16& x16 = {});

// The same where consecutive rows of x lie x_stride floats apart (a column slice of a wider matrix); x16, when
// present, is contiguous: [num_rows, w.cols].
void linear_strided(Gemm& gemm,
                    const float* x,  // [num_rows, x_stride], the first w.cols columns read
                    int64_t x_stride, int64_t num_rows,
                    const DeviceMatrix& w,  // [N, K]
                    float* y,               // [num_rows, w.rows]
                    const Narrow16& x16 = {});

// SwiGLU fused into the GEMM of a row or two (decode): out[m, i] = silu(y[m, i]) * y[m, I + i] for y = x · wᵀ,
// w's first I rows the gates and its last I the ups; out16, when present, gets out rounded, and out may then be
// null. linear_swiglu_fuses says whether the operands take it (16-bit weights, the skinny GEMM; I even); where
// not, the caller runs linear and then SwiGLU.
bool linear_swiglu_fuses(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16);
void linear_swiglu(Gemm& gemm,
                   const float* x,  // [num_rows, w.cols]
                   int64_t num_rows,
                   const DeviceMatrix& w,  // [2I, K]
                   const Narrow16& x16,
                   float* out,              // [num_rows, I] or null
                   const Narrow16& out16);  // [num_rows, I] or absent

// A decode step's Mamba in_proj with the conv fused (DecodeConv, mamba_kernels.h): y = x · wᵀ where outputs
// [0, Di), the conv's inputs u, go through the conv instead of into y. linear_conv_fuses says whether the operands
// take it (16-bit weights, the skinny GEMM, every row one token); where not, the caller runs linear, then the conv.
bool linear_conv_fuses(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16,
                       const DecodeConv& conv);
void linear_conv(Gemm& gemm,
                 const float* x,  // [num_rows, w.cols]
                 int64_t num_rows,
                 const DeviceMatrix& w,  // [2*Di, K]
                 const Narrow16& x16,
                 float* y,  // [num_rows, 2*Di]; columns Di.. written
                 const DecodeConv& conv);

}  // namespace jambo::cuda
