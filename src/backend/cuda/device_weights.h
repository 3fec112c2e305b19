// The model's weights on the GPU, uploaded once from the host views (the safetensors mmap or the random
// weights) with cudaMemcpy, no host copy in between. GEMM weights keep a dtype so that a bf16 mode (weights
// as stored) can come beside the f32 mode of this slice (weights upcast to fp32 on the GPU at load).
#pragma once

#include "backend/cuda/device_memory.h"
#include "model/weights.h"

#include <map>
#include <memory>
#include <vector>

namespace jambo::cuda {

// How GEMM weights are held on the GPU.
enum class WeightMode { F32 };  // F32: upcast at load, fp32 GEMMs (exact against the CPU backend)

// A weight matrix in nn.Linear layout [rows = out features, cols = in features], row-major, on the GPU.
struct DeviceMatrix {
  const void* data = nullptr;  // [rows, cols]
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct DeviceAttention {
  DeviceMatrix q_proj;  // [nh*hd, H]
  DeviceMatrix k_proj;  // [nkv*hd, H]
  DeviceMatrix v_proj;  // [nkv*hd, H]
  DeviceMatrix o_proj;  // [H, nh*hd]
};

// Small vectors are always fp32; a null pointer stands for an absent bias.
struct DeviceMamba {
  DeviceMatrix in_proj;                  // [2*Di, H]
  const float* in_proj_bias = nullptr;   // [2*Di] or null
  const float* conv_weight = nullptr;    // [Di, K]
  const float* conv_bias = nullptr;      // [Di] or null
  DeviceMatrix x_proj;                   // [R + 2N, Di]
  const float* dt_norm = nullptr;        // [R]
  const float* b_norm = nullptr;         // [N]
  const float* c_norm = nullptr;         // [N]
  DeviceMatrix dt_proj;                  // [Di, R]
  const float* dt_proj_bias = nullptr;   // [Di]
  const float* a = nullptr;              // [Di, N] A = -exp(A_log), computed at load
  const float* d = nullptr;              // [Di]
  DeviceMatrix out_proj;                 // [H, Di]
  const float* out_proj_bias = nullptr;  // [H] or null
};

struct DeviceMlp {
  DeviceMatrix gate_proj;  // [I, H]
  DeviceMatrix up_proj;    // [I, H]
  DeviceMatrix down_proj;  // [H, I]
};

struct DeviceMoe {
  DeviceMatrix router;             // [E, H]
  std::vector<DeviceMlp> experts;  // [E]
};

struct DeviceLayer {
  const float* input_norm = nullptr;   // [H]
  const float* pre_ff_norm = nullptr;  // [H]
  DeviceAttention attention;
  DeviceMamba mamba;
  DeviceMlp mlp;
  DeviceMoe moe;
};

class DeviceWeights {
 public:
  DeviceWeights(const Model& model, WeightMode mode, cudaStream_t stream);

  const float* embed_tokens = nullptr;  // [V, H] fp32 (the embedding lookup reads it)
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;  // [H]
  DeviceMatrix lm_head;               // [V, H]; the embedding itself when tied
  int64_t bytes_on_device = 0;

 private:
  const float* upload_vector(const TensorView& view);  // fp32 copy; null for an empty view
  DeviceMatrix upload_matrix(const TensorView& view);  // in the mode's dtype
  const float* upload_as_f32(const TensorView& view);  // one upload per host pointer and shape
  const float* negative_exp(const TensorView& a_log);  // -exp(A_log), fp32

  WeightMode mode_;
  cudaStream_t stream_;
  std::vector<DeviceBuffer<float>> owned_;
  DeviceBuffer<uint16_t> staging_;                                    // a 16-bit tensor on its way to fp32
  std::map<std::pair<const void*, int64_t>, const float*> uploaded_;  // (host data, numel) -> device copy
};

}  // namespace jambo::cuda
