// Dense GEMMs: y = x · wᵀ with w in nn.Linear layout, all row-major. fp32 weights run as fp32 cuBLAS GEMMs;
// 16-bit weights (the bf16 and f16 modes) run with the activations rounded to the weight's 16-bit type at the GEMM
// input, fp32 accumulation and fp32 output: as a cuBLASLt matmul on a narrowed copy of x, or, for a row or two
// (decode), as skinny_gemm, which rounds x as it reads it. An invariant Gemm runs them all, fp32 weights too, as the
// invariant GEMM in one summation order for every row count instead (tensor_gemm.h), without the decode fusions:
// slower today (bench/gemm_bench.cpp), and a row's GEMM outputs no longer depend on its batch.
//
// Why round the input rather than keep it fp32: cuBLAS and the tensor cores take both operands in one type, so an
// fp32 input would need the weights upcast (the f32 mode: twice the bytes, and decode is bandwidth-bound) or a custom
// mixed-type kernel; the rounding reads T*K fp32 and writes T*K bf16, little beside the N*K weights (N >= 16 here),
// and everything outside the GEMMs (residual stream, norms, scan, state) stays fp32. Producers that write the rounded
// copy themselves (Narrow16) save the rounding's launch.
//
// Why cuBLASLt rather than cublasGemmEx for 16-bit weights: the same kernels and the same heuristic, but the
// algorithm is ours to choose, once per shape, from the heuristic's ranked candidates (choose_gemm_candidate), and a
// plan made once skips the per-call heuristic on the host. Timed in CUDA graphs on an H200, the heuristic's first
// candidate runs as fast as cublasGemmEx's choice at every 3B shape from 8 to 256 rows; the one choice that differs,
// down_proj at 256 rows without split-K, takes 20.3 us where the split-K candidate and its reduction take 24.9. In
// the engine (3B, batch-256 decode, runs A B A B): 6.463/6.463 -> 6.455/6.426 ms a step in the layers.
#pragma once

#include "backend/cuda/device_weights.h"
#include "backend/cuda/mamba.h"
#include "backend/cuda/narrow16.h"
#include "backend/cuda/tensor_gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <tuple>

namespace jambo::backend::cuda {

// A candidate of cuBLASLt's heuristic, as choose_gemm_candidate sees it.
struct GemmCandidate {
  bool splits_k = false;  // its sum over K is split across blocks and reduced by a second kernel
  float waves = 0.0f;     // the heuristic's estimate of the GPU's waves of blocks it takes
};

// A split-K candidate is passed over for one that runs unsplit at least this fraction of a wave full.
constexpr float kMinWavesWithoutSplitK = 0.75f;

// The candidate to run, from the heuristic's ranked list (non-empty): its first, unless that splits K and a later
// one that does not fills at least kMinWavesWithoutSplitK of the GPU, which saves the reduction's launch and the
// partial sums' round trip (H200, batch-256 down_proj [2560, 8192]: split-K 24.9 us in two kernels, the unsplit
// 0.82-wave candidate 20.3 us; no other 3B shape at 8 to 2048 rows meets the condition). The same list gives the
// same choice, so a shape's results do not change from run to run.
size_t choose_gemm_candidate(std::span<const GemmCandidate> candidates);

// The cuBLAS handle bound to a stream, and the scratch that holds a GEMM's input rounded to 16 bits.
class Gemm {
 public:
  // pedantic: TF32 and other reduced-precision shortcuts off (the f32 mode must agree with the CPU backend
  // to 1e-4 on logprobs); the bf16 mode leaves cuBLAS its default math. invariant: every weight through
  // tensor_gemm, for every row count.
  Gemm(cudaStream_t stream, bool pedantic, bool invariant = false);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  cublasHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }
  bool invariant() const { return invariant_; }
  TensorGemmScratch& tensor_scratch() { return tensor_scratch_; }
  uint16_t* narrow_input(int64_t num_elements) { return narrow_input_.reserve(num_elements); }

  // y [num_rows, w.rows] = x16 [num_rows, w.cols] · wᵀ for 16-bit weights, fp32 accumulation and output, as the
  // cuBLASLt matmul planned for its shape (made on first use; the plan's candidate from choose_gemm_candidate).
  void matmul16(const uint16_t* x16, int64_t num_rows, const DeviceMatrix& w, float* y);

  struct LtPlan;  // descriptors and the chosen algorithm of one shape (gemm.cpp)

 private:
  // (rows, N, K, dtype, and the alignments of w, x16 and y: an algorithm may assume its operands' alignment)
  using LtShape = std::tuple<int64_t, int64_t, int64_t, DType, uint32_t, uint32_t, uint32_t>;
  const LtPlan& plan(const LtShape& shape);

  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool invariant_ = false;
  TensorGemmScratch tensor_scratch_;
  DeviceBuffer<uint16_t> narrow_input_;  // [rows, K] x in the weight's 16-bit type
  DeviceBuffer<std::byte> workspace_;    // cuBLAS's own, set once: a captured GEMM must not allocate
  std::map<LtShape, std::unique_ptr<LtPlan>> plans_;
};

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
// null. linear_swiglu_fuses says whether the operands take it (16-bit weights, the skinny GEMM, a Gemm that is not
// invariant); where not, the caller runs linear and then SwiGLU.
bool linear_swiglu_fuses(const Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w,
                         const Narrow16& x16);
void linear_swiglu(Gemm& gemm,
                   const float* x,  // [num_rows, w.cols]
                   int64_t num_rows,
                   const DeviceMatrix& w,   // [2I, K]
                   const Narrow16& x16,     // [num_rows, K] x rounded by its producer, or absent
                   float* out,              // [num_rows, I] or null
                   const Narrow16& out16);  // [num_rows, I] or absent

// A decode step's Mamba in_proj with the conv fused (DecodeConv, mamba.h): y = x · wᵀ where outputs
// [0, Di), the conv's inputs u, go through the conv instead of into y. linear_conv_fuses says whether the operands
// take it (16-bit weights, the skinny GEMM, every row one token, a Gemm that is not invariant); where not, the caller
// runs linear, then the conv.
bool linear_conv_fuses(const Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16,
                       const DecodeConv& conv);
void linear_conv(Gemm& gemm,
                 const float* x,  // [num_rows, w.cols]
                 int64_t num_rows,
                 const DeviceMatrix& w,  // [2*Di, K]
                 const Narrow16& x16,    // [num_rows, K] x rounded by its producer, or absent
                 float* y,               // [num_rows, 2*Di]; columns Di.. written
                 const DecodeConv& conv);

}  // namespace jambo::backend::cuda
