#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace jambo::backend::cuda {

void fail_cuda(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // an error that leaves the context usable (a failed allocation) must not be reported again
  const char* hint = status == cudaErrorMemoryAllocation ? "lower --memory-budget or the batch size"
                     : status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver
                         ? "no usable GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES"
                         : "a kernel may have failed earlier; rerun with CUDA_LAUNCH_BLOCKING=1 to find it";
  fail("CUDA error at {}:{}: {} failed: {} ({}); {}", file, line, call, cudaGetErrorString(status),
       cudaGetErrorName(status), hint);
}

void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  fail("cuBLAS error at {}:{}: {} failed: {} ({}); check the matrix sizes and that the GPU has memory left", file, line,
       call, cublasGetStatusString(status), cublasGetStatusName(status));
}

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  JAMBO_CUDA_CHECK(cudaGetDevice(&device));
  JAMBO_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

void* driver_function(const char* name, int version, const char* needed_for) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  JAMBO_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &function, version, cudaEnableDefault, &found));
  require(found == cudaDriverEntryPointSuccess && function != nullptr,
          std::string("the CUDA driver has no ") + name + " (" + needed_for + ")");
  return function;
}

}  // namespace jambo::backend::cuda
