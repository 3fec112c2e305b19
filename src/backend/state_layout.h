// Where a sequence's recurrent state lies in its slot of the state pool: each Mamba layer's conv tails [Di, K-1]
// (the last K-1 inputs u, oldest first), then its SSM state [Di, N], layer after layer. One definition for the CPU
// pool, the CUDA backend and the memory plan, which must agree on a slot's size.
#pragma once

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/config.h"

#include <cstdint>
#include <vector>

namespace jambo::backend {

struct StateSlotLayout {
  int64_t conv_tail_size = 0;  // Di * (K-1): one layer's conv tails
  int64_t layer_stride = 0;    // Di * (K-1 + N): one layer's conv tails and SSM state
  int64_t slot_stride = 0;     // num_mamba_layers * layer_stride: the elements of one slot

  explicit StateSlotLayout(const model::JambaConfig& config)
      : conv_tail_size(config.mamba_d_inner * (config.mamba_d_conv - 1)),
        layer_stride(config.mamba_d_inner * (config.mamba_d_conv - 1 + config.mamba_d_state)),
        slot_stride(config.num_mamba_layers() * layer_stride) {}

  // Bytes of num_slots slots stored as `dtype`, in 64-bit arithmetic (law 3).
  int64_t pool_bytes(int64_t num_slots, DType dtype) const {
    return element_offset(element_offset(num_slots, slot_stride), dtype_size(dtype));
  }
};

// Each layer's index among the layers of its mixer kind: where a Mamba layer's state lies in a slot, and an
// attention layer's keys and values in a KV block.
inline std::vector<int64_t> indices_within_kind(const model::JambaConfig& config) {
  std::vector<int64_t> indices;
  int64_t num_mamba = 0, num_attention = 0;
  for (model::MixerKind kind : config.mixer_kinds)
    indices.push_back(kind == model::MixerKind::Attention ? num_attention++ : num_mamba++);
  return indices;
}

}  // namespace jambo::backend
