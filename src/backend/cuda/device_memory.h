// Device memory: an owning buffer of T that grows on demand, on the GPU or in page-locked host memory (the staging
// of transfers), the one 64-bit offset helper on the GPU, and the scope that makes a GPU current.
#pragma once

#include "backend/cuda/cuda_check.h"
#include "core/host_device.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

namespace jambo::backend::cuda {

// Law 3 on the device: the twin of element_offset (core/tensor.h). Both factors are int64_t.
JAMBO_HOST_DEVICE inline int64_t device_offset(int64_t index, int64_t stride) { return index * stride; }

// Makes `device` the calling thread's current GPU (where buffers are allocated and kernels launched) until the scope
// ends, then the one before it again: a backend of one tensor-parallel rank holds every call to its own GPU.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    JAMBO_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) JAMBO_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceScope() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_, previous_ = 0;
};

// How many DeviceBuffers have been cudaMalloc'd so far in this process. A captured CUDA graph holds raw device
// pointers: a change of this count tells its owner that a buffer it captured may have moved (step_graphs.h).
inline std::atomic<int64_t>& device_allocation_count() {
  static std::atomic<int64_t> count{0};
  return count;
}

// Where a Buffer's memory lives: GPU memory (cudaMalloc, counted by device_allocation_count), or page-locked host
// memory (cudaMallocHost), what a transfer to or from the GPU stages through, so that cudaMemcpyAsync is truly
// asynchronous and runs at the bus's speed.
struct DeviceMemory {
  static constexpr const char* kName = "device";
  static void* allocate(size_t num_bytes) {
    void* data = nullptr;
    JAMBO_CUDA_CHECK(cudaMalloc(&data, num_bytes));
    ++device_allocation_count();
    return data;
  }
  static void free(void* data) { cudaFree(data); }
};
struct PinnedHostMemory {
  static constexpr const char* kName = "host";
  static void* allocate(size_t num_bytes) {
    void* data = nullptr;
    JAMBO_CUDA_CHECK(cudaMallocHost(&data, num_bytes));
    return data;
  }
  static void free(void* data) { cudaFreeHost(data); }
};

// Owning storage of num_elements T in Memory; uninitialized unless zeroed.
template <typename T, typename Memory>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t num_elements) { allocate(num_elements); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  T* data() const { return data_; }
  int64_t size() const { return size_; }

  // Makes room for at least num_elements; old contents are lost when it grows.
  T* reserve(int64_t num_elements) {
    if (num_elements > size_) {
      release();
      allocate(num_elements + num_elements / 4);  // headroom, so that steps of varying size rarely reallocate
    }
    return data_;
  }

 private:
  void allocate(int64_t num_elements) {
    require(num_elements >= 0, std::string("negative ") + Memory::kName + " allocation of " +
                                   std::to_string(num_elements) + " elements");
    if (num_elements > 0) data_ = static_cast<T*>(Memory::allocate(size_t(device_offset(num_elements, sizeof(T)))));
    size_ = num_elements;
  }
  void release() {
    if (data_ != nullptr) Memory::free(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

template <typename T>
using DeviceBuffer = Buffer<T, DeviceMemory>;
template <typename T>
using PinnedBuffer = Buffer<T, PinnedHostMemory>;

}  // namespace jambo::backend::cuda
