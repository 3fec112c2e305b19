#include "backend/cuda/gemm.h"

#include "backend/cuda/convert.h"
#include "backend/cuda/skinny_gemm.h"
#include "core/error.h"

#include <limits>

namespace jambo::cuda {

Gemm::Gemm(cudaStream_t stream, bool pedantic) : stream_(stream) {
  JAMBO_CUBLAS_CHECK(cublasCreate(&handle_));
  JAMBO_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  JAMBO_CUBLAS_CHECK(cublasSetMathMode(handle_, pedantic ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;  // what cuBLAS's documentation asks for on Hopper
  workspace_ = DeviceBuffer<std::byte>(kWorkspaceBytes);
  JAMBO_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), size_t(kWorkspaceBytes)));
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

namespace {

// 16-bit weights and a row or two of x: the skinny GEMM's case, the only one its fusions take.
bool runs_skinny(const DeviceMatrix& w, int64_t num_rows) {
  return w.dtype != DType::F32 && num_rows >= 1 && num_rows <= kMaxSkinnyGemmRows;
}

// The skinny GEMM's operands for y = x · wᵀ (16-bit weights), x16 used where it has the weights' type.
SkinnyGemm skinny_params(const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y,
                         const Narrow16& x16) {
  SkinnyGemm skinny;
  skinny.x = x, skinny.x_stride = x_stride, skinny.num_rows = num_rows;
  skinny.weight = w.data, skinny.dtype = w.dtype, skinny.n = w.rows, skinny.k = w.cols, skinny.y = y;
  if (x16.present() && x16.dtype == w.dtype) skinny.x16 = x16.data;
  return skinny;
}

SkinnyGemm swiglu_params(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* out,
                         const Narrow16& out16) {
  SkinnyGemm skinny = skinny_params(x, w.cols, num_rows, w, out, x16);
  skinny.swiglu = true, skinny.y16 = out16;
  return skinny;
}

SkinnyGemm conv_params(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* y,
                       const DecodeConv& conv) {
  SkinnyGemm skinny = skinny_params(x, w.cols, num_rows, w, y, x16);
  skinny.conv = conv;
  return skinny;
}

void run_linear(Gemm& gemm, const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y,
                const Narrow16& x16) {
  if (num_rows == 0) return;
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  JAMBO_REQUIRE(num_rows <= kMaxInt && w.rows <= kMaxInt && w.cols <= kMaxInt && x_stride <= kMaxInt,
                "GEMM of {} rows by a [{}, {}] weight is beyond cuBLAS's 32-bit sizes", num_rows, w.rows, w.cols);
  const int m = int(w.rows), n = int(num_rows), k = int(w.cols);
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: yᵀ [N_out, rows] = w (read as [K, N_out], transposed) · xᵀ [K, rows].
  if (w.dtype == DType::F32) {
    JAMBO_CUBLAS_CHECK(cublasSgemm(gemm.handle(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                                   static_cast<const float*>(w.data), k, x, int(x_stride), &zero, y, m));
    return;
  }
  if (runs_skinny(w, num_rows)) {
    const SkinnyGemm skinny = skinny_params(x, x_stride, num_rows, w, y, x16);
    if (skinny_gemm_applies(skinny)) {
      skinny_gemm(skinny, gemm.stream());
      return;
    }
  }
  const bool is_bf16 = w.dtype == DType::BF16;
  const uint16_t* narrow = x16.data;
  if (!x16.present() || x16.dtype != w.dtype) {
    uint16_t* rounded = gemm.narrow_input(element_offset(num_rows, w.cols));
    narrow_to_16(x, x_stride, num_rows, w.cols, is_bf16, rounded, gemm.stream());
    narrow = rounded;
  }
  const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : CUDA_R_16F;
  JAMBO_CUBLAS_CHECK(cublasGemmEx(gemm.handle(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w.data, type, k, narrow, type,
                                  k, &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void linear(Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, float* y, const Narrow16& x16) {
  run_linear(gemm, x, w.cols, num_rows, w, y, x16);
}

void linear_strided(Gemm& gemm, const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y,
                    const Narrow16& x16) {
  run_linear(gemm, x, x_stride, num_rows, w, y, x16);
}

bool linear_swiglu_fuses(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16) {
  return runs_skinny(w, num_rows) && skinny_gemm_applies(swiglu_params(x, num_rows, w, x16, nullptr, {}));
}

void linear_swiglu(Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* out,
                   const Narrow16& out16) {
  require(linear_swiglu_fuses(x, num_rows, w, x16),
          "linear_swiglu called on operands it does not take (please report this)");
  skinny_gemm(swiglu_params(x, num_rows, w, x16, out, out16), gemm.stream());
}

bool linear_conv_fuses(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16,
                       const DecodeConv& conv) {
  return runs_skinny(w, num_rows) && conv.rows.num_chunks == 0 && conv.rows.num_tokens == num_rows &&
         w.rows == 2 * conv.layout.num_channels && conv.layout.kernel_size >= 1 &&
         conv.layout.kernel_size <= kMaxConvTaps &&
         skinny_gemm_applies(conv_params(x, num_rows, w, x16, nullptr, conv));
}

void linear_conv(Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* y,
                 const DecodeConv& conv) {
  require(linear_conv_fuses(x, num_rows, w, x16, conv),
          "linear_conv called on operands it does not take (please report this)");
  skinny_gemm(conv_params(x, num_rows, w, x16, y, conv), gemm.stream());
}

}  // namespace jambo::cuda
