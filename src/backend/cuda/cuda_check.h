// Error checks for CUDA runtime and cuBLAS calls: a failure throws jambo::Error naming the file, the
// line, the call that failed, CUDA's own message and a hint of what to look at. Free of fmt, so that
// .cu files (which nvcc compiles) can use it; the messages are formatted in cuda_check.cpp.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace jambo::backend::cuda {

[[noreturn]] void fail_cuda(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line);

// Throws jambo::Error with `message` unless `condition` holds (JAMBO_REQUIRE for .cu files).
void require(bool condition, const std::string& message);

// An attribute of the current GPU (callers keep it in a static: asked once).
int current_device_attribute(cudaDeviceAttr attribute);

// A CUDA driver API function the runtime API lacks, by name and the CUDA version of its signature (cast it to that
// version's PFN_ type); throws jambo::Error saying `needed_for` where the driver has none.
void* driver_function(const char* name, int version, const char* needed_for);

}  // namespace jambo::backend::cuda

#define JAMBO_CUDA_CHECK(call)                                                                                     \
  do {                                                                                                             \
    const cudaError_t jambo_status_ = (call);                                                                      \
    if (jambo_status_ != cudaSuccess) ::jambo::backend::cuda::fail_cuda(jambo_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define JAMBO_CUBLAS_CHECK(call)                                                     \
  do {                                                                               \
    const cublasStatus_t jambo_status_ = (call);                                     \
    if (jambo_status_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::jambo::backend::cuda::fail_cublas(jambo_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad launch configuration shows here, naming the kernel.
#define JAMBO_CUDA_CHECK_LAUNCH(kernel_name)                                                           \
  do {                                                                                                 \
    const cudaError_t jambo_status_ = cudaGetLastError();                                              \
    if (jambo_status_ != cudaSuccess)                                                                  \
      ::jambo::backend::cuda::fail_cuda(jambo_status_, "launch of " #kernel_name, __FILE__, __LINE__); \
  } while (0)
