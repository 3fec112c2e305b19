// Uploads one step's rows (backend.h) to the GPU as DeviceRows, in one transfer.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/device_rows.h"

#include <cstdint>
#include <span>
#include <vector>

namespace jambo::backend::cuda {

class StepRowsUploader {
 public:
  // Packs the rows (with the backend's per-row state offset and read flag) into one pinned buffer and
  // copies it to the GPU in one transfer on `stream`.
  DeviceRows upload(std::span<const BatchRow> rows, std::span<const int64_t> state_offsets,
                    std::span<const int32_t> reads_state, cudaStream_t stream);

 private:
  std::vector<int64_t> host_;     // the packed step, 8-byte words
  PinnedBuffer<int64_t> pinned_;  // [words] staging for the transfer
  DeviceBuffer<int64_t> device_;  // [words]
};

}  // namespace jambo::backend::cuda
