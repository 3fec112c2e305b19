// Uploads one step's rows (backend.h) to the GPU as DeviceRows, in one transfer.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/device_rows.h"

#include <cstdint>
#include <span>
#include <vector>

namespace jambo::backend::cuda {

// Whether the kernels write this checkpoint as they pass it (DeviceRows): it lies before the row's last token.
inline bool is_inside_row(const BatchRow& row, const StateCheckpoint& checkpoint) {
  return checkpoint.num_tokens < int64_t(row.tokens.size());
}

class StepRowsUploader {
 public:
  // Packs the rows (with the backend's per-row state offset and read flag, and the state offset of every checkpoint,
  // in row order) into one pinned buffer and copies it to the GPU in one transfer on `stream`; the checkpoints inside
  // a row go to the kernels (DeviceRows).
  DeviceRows upload(std::span<const BatchRow> rows, std::span<const int64_t> state_offsets,
                    std::span<const int32_t> reads_state, std::span<const int64_t> checkpoint_offsets,
                    cudaStream_t stream);

 private:
  std::vector<int64_t> host_;     // the packed step, 8-byte words
  PinnedBuffer<int64_t> pinned_;  // [words] staging for the transfer
  DeviceBuffer<int64_t> device_;  // [words]
};

}  // namespace jambo::backend::cuda
