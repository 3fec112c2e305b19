// Tensors of another process's GPU memory, shared by CUDA IPC (a trainer on the same GPU sending its weights), opened
// in this process as a checkpoint whose views point into that memory.
#pragma once

#include "backend/backend.h"
#include "model/safetensors.h"

#include <span>

namespace jambo::backend::cuda {

// Opens each allocation once (a process may not open one handle twice) and checks that each tensor lies inside its
// allocation, so a bad offset is refused naming the tensor rather than read past. The checkpoint's storage closes
// the allocations when its last copy goes. Throws jambo::Error naming the tensor whose handle does not open.
model::Checkpoint open_ipc_tensors(std::span<const IpcTensor> tensors);

}  // namespace jambo::backend::cuda
