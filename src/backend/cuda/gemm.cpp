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
  if (num_rows <= kMaxSkinnyGemmRows) {
    SkinnyGemm skinny;
    skinny.x = x, skinny.x_stride = x_stride, skinny.num_rows = num_rows;
    skinny.weight = w.data, skinny.dtype = w.dtype, skinny.n = w.rows, skinny.k = w.cols, skinny.y = y;
    if (x16.present() && x16.dtype == w.dtype) skinny.x16 = x16.data;
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

}  // namespace jambo::cuda
