// The two sequence mixers on the GPU, each a chain of cuBLAS GEMMs and the kernels of its family, over all
// rows of a step: the Mamba mixer (spec §3.5) and the attention mixer (spec §3.4). The backend runs them
// layer by layer; the tests run each against its CPU twin (cpu::mamba_mixer, cpu::attention_mixer).
#pragma once

#include "backend/cuda/attention.h"
#include "backend/cuda/device_communicator.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/mamba.h"
#include "model/config.h"

namespace jambo::backend::cuda {

// Intermediates of the Mamba mixer, grown on demand.
struct MambaScratch {
  DeviceBuffer<float> projected;       // [T, 2*Di] in_proj: u then z
  DeviceBuffer<float> activated;       // [T, Di] u after the conv and SiLU
  DeviceBuffer<uint16_t> activated16;  // [T, Di] the same rounded for a 16-bit x_proj
  DeviceBuffer<float> selective;       // [T, R + 2N] x_proj output (dt, B, C), normalized in place
  DeviceBuffer<uint16_t> dt16;         // [T, R] its normalized dt rounded for a 16-bit dt_proj
  DeviceBuffer<float> delta;           // [T, Di] dt_proj output, before its bias
  DeviceBuffer<float> gated;           // [T, Di] the scan's output
  DeviceBuffer<uint16_t> gated16;      // [T, Di] the same rounded for a 16-bit out_proj
};

// out = Mamba(x); each row's conv tail and SSM state in its slot of state_pool are carried forward. x16: x
// rounded by its producer (gemm.h), or absent; likewise for the attention mixer. With a communicator the weights are
// one rank's shard (model/tensor_parallel.h): x_proj's partial sums over the rank's channels are summed over the
// ranks before dt_proj and the norms, and `out` is the rank's partial sum, which the caller sums.
void mamba_mixer(Gemm& gemm, const DeviceMamba& weights, const model::JambaConfig& config,
                 const MambaStateLayout& layout, const DeviceRows& rows,
                 const float* x,          // [T, H] (already normalized)
                 StateValues state_pool,  // [num_slots, elements_per_slot]
                 float* out,              // [T, H]
                 MambaScratch& scratch, cudaStream_t stream, const Narrow16& x16 = {},
                 DeviceCommunicator* communicator = nullptr);

// Intermediates of the attention mixer, grown on demand.
struct AttentionScratch {
  DeviceBuffer<float> queries;  // [T, nh*hd]
  DeviceBuffer<float> keys;     // [T, nkv*hd]
  DeviceBuffer<float> values;   // [T, nkv*hd]
  DeviceBuffer<float> context;  // [T, nh*hd]
  DeviceBuffer<float> partial;  // [splits, nh, hd + 2] the decode rows' splits (attention_partial_size)
};

// Writes this step's keys and values into each row's blocks, then out = attention(x).
void attention_mixer(Gemm& gemm, const DeviceAttention& weights, const model::JambaConfig& config,
                     const KvLayout& layout, const DeviceRows& rows,
                     const float* x,  // [T, H] (already normalized)
                     float* kv_pool,  // [num_blocks, block_stride]
                     float* out,      // [T, H]
                     AttentionScratch& scratch, cudaStream_t stream, const Narrow16& x16 = {});

}  // namespace jambo::backend::cuda
