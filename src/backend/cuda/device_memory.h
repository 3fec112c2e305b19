// Device memory: an owning buffer of T that grows on demand, its page-locked host twin (the staging of transfers),
// the one 64-bit offset helper on the GPU, and the scope that makes a GPU current.
#pragma once

#include "backend/cuda/cuda_check.h"
#include "core/host_device.h"

#include <atomic>
#include <cstdint>
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

// cudaMalloc'd storage of num_elements T; uninitialized unless zeroed.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t num_elements) { allocate(num_elements); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
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
    require(num_elements >= 0, "negative device allocation of " + std::to_string(num_elements) + " elements");
    if (num_elements > 0) {
      JAMBO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), size_t(device_offset(num_elements, sizeof(T)))));
      ++device_allocation_count();
    }
    size_ = num_elements;
  }
  void release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

// cudaMallocHost'd (page-locked) storage of num_elements T on the host, as DeviceBuffer: what a transfer to or from
// the GPU stages through, so that cudaMemcpyAsync is truly asynchronous and runs at the bus's speed.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(int64_t num_elements) { allocate(num_elements); }
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
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
      allocate(num_elements + num_elements / 4);  // headroom, as DeviceBuffer's
    }
    return data_;
  }

 private:
  void allocate(int64_t num_elements) {
    require(num_elements >= 0, "negative host allocation of " + std::to_string(num_elements) + " elements");
    if (num_elements > 0)
      JAMBO_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), size_t(device_offset(num_elements, sizeof(T)))));
    size_ = num_elements;
  }
  void release() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace jambo::backend::cuda
