#include "backend/cuda/ipc_tensors.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace jambo::backend::cuda {
namespace {

// The allocations opened, closed when the checkpoint holding them goes.
struct OpenedAllocations {
  struct Allocation {
    std::byte* base = nullptr;
    int64_t num_bytes = 0;
  };
  std::map<std::array<std::byte, 64>, Allocation> by_handle;
  ~OpenedAllocations() {
    for (const auto& [handle, allocation] : by_handle)
      if (allocation.base != nullptr) cudaIpcCloseMemHandle(allocation.base);
  }
};

// The size of the allocation starting at base (the runtime API has no call for it).
int64_t allocation_bytes(const void* base) {
  static const auto address_range = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(
      driver_function("cuMemGetAddressRange", 3020, "to bound the tensors shared by CUDA IPC"));
  CUdeviceptr start = 0;
  size_t num_bytes = 0;
  require(address_range(&start, &num_bytes, reinterpret_cast<CUdeviceptr>(base)) == CUDA_SUCCESS,
          "cuMemGetAddressRange failed on an allocation opened by CUDA IPC");
  return int64_t(num_bytes) - int64_t(reinterpret_cast<CUdeviceptr>(base) - start);
}

OpenedAllocations::Allocation& open(OpenedAllocations& opened, const IpcTensor& tensor) {
  const auto [at, fresh] = opened.by_handle.try_emplace(tensor.handle);
  if (!fresh) return at->second;
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, tensor.handle.data(), sizeof(handle));
  void* base = nullptr;
  const cudaError_t status = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    opened.by_handle.erase(at);
    fail("tensor '{}': its CUDA IPC handle does not open here ({}): a handle of another GPU, of this process, or of "
         "memory its owner has freed",
         tensor.name, cudaGetErrorString(status));
  }
  at->second.base = static_cast<std::byte*>(base);  // closed with the others, whatever follows
  at->second.num_bytes = allocation_bytes(base);
  return at->second;
}

}  // namespace

model::Checkpoint open_ipc_tensors(std::span<const IpcTensor> tensors) {
  auto opened = std::make_shared<OpenedAllocations>();
  std::vector<TensorView> views;
  for (const IpcTensor& tensor : tensors) {
    const OpenedAllocations::Allocation& allocation = open(*opened, tensor);
    TensorView view;
    view.name = tensor.name;
    view.dtype = tensor.dtype;
    view.shape = tensor.shape;
    const int64_t num_bytes = view.numel() * dtype_size(tensor.dtype);
    JAMBO_REQUIRE(tensor.offset >= 0 && tensor.offset % int64_t(dtype_size(tensor.dtype)) == 0 &&
                      tensor.offset + num_bytes <= allocation.num_bytes,
                  "tensor '{}': {} bytes at offset {} do not lie inside its allocation of {} bytes (or the offset is "
                  "not a multiple of its element size)",
                  tensor.name, num_bytes, tensor.offset, allocation.num_bytes);
    view.data = allocation.base + tensor.offset;
    views.push_back(std::move(view));
  }
  return model::Checkpoint::on_device(std::move(views), "the tensors shared by CUDA IPC", std::move(opened));
}

}  // namespace jambo::backend::cuda
