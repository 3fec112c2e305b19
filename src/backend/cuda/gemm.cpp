#include "backend/cuda/gemm.h"

#include "core/error.h"

#include <limits>

namespace jambo::cuda {

cublasHandle_t make_cublas(cudaStream_t stream) {
  cublasHandle_t handle = nullptr;
  JAMBO_CUBLAS_CHECK(cublasCreate(&handle));
  JAMBO_CUBLAS_CHECK(cublasSetStream(handle, stream));
  JAMBO_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
  return handle;
}

void linear(cublasHandle_t cublas, const float* x, int64_t num_rows, const DeviceMatrix& w, float* y) {
  linear_strided(cublas, x, w.cols, num_rows, w, y);
}

void linear_strided(cublasHandle_t cublas, const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w,
                    float* y) {
  if (num_rows == 0) return;
  JAMBO_ASSERT(w.dtype == DType::F32);
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  JAMBO_REQUIRE(num_rows <= kMaxInt && w.rows <= kMaxInt && w.cols <= kMaxInt && x_stride <= kMaxInt,
                "GEMM of {} rows by a [{}, {}] weight is beyond cuBLAS's 32-bit sizes", num_rows, w.rows, w.cols);
  const int m = int(w.rows), n = int(num_rows), k = int(w.cols);
  const float one = 1.0f, zero = 0.0f;
  // Column-major view: yᵀ [N_out, rows] = w (read as [K, N_out], transposed) · xᵀ [K, rows].
  JAMBO_CUBLAS_CHECK(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, static_cast<const float*>(w.data), k,
                                 x, int(x_stride), &zero, y, m));
}

}  // namespace jambo::cuda
