// The model's weights on the GPU, uploaded once from the host views (the safetensors mmap or the random
// weights) with cudaMemcpy, no host copy in between, or, for a model without host data (describe_random_model),
// generated on the GPU from its random recipe, bitwise equal to the host fill. GEMM weights are fp32 (f32 mode: upcast
// on the GPU at load), as stored (bf16 mode: bf16 and f16 matrices stay 16-bit) or IEEE half (f16 mode: converted
// on the GPU at load); small vectors and the embedding table (a row lookup) are always fp32.
#pragma once

#include "backend/cuda/device_memory.h"
#include "model/weight_update.h"
#include "model/weights.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace jambo::backend::cuda {

// How GEMM weights are held on the GPU.
enum class WeightMode {
  F32,   // upcast at load, fp32 GEMMs (within 1e-4 of the CPU backend on logprobs)
  Bf16,  // GEMM weights as stored (bf16, f16; f32 stays f32), GEMM inputs rounded to the weight's type
  F16,   // GEMM weights in IEEE half (bf16 and f32 converted; a value beyond half's range refused), inputs likewise
};

// "f32", "bf16" or "f16"; throws jambo::Error naming the value otherwise.
WeightMode parse_weight_mode(const std::string& name);

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
  DeviceMatrix gate_up;    // [2I, H] gate_proj's rows, then up_proj's: one GEMM computes both
  DeviceMatrix down_proj;  // [H, I]
};

struct DeviceMoe {
  DeviceMatrix router;             // [E, H]
  std::vector<DeviceMlp> experts;  // [E]
  // On the GPU, for the grouped GEMMs: the experts' gate_up data pointers [E], then down_proj's.
  const void* const* expert_matrices = nullptr;  // [2, E]
};

struct DeviceLayer {
  const float* input_norm = nullptr;   // [H]
  const float* pre_ff_norm = nullptr;  // [H]
  DeviceAttention attention;
  DeviceMamba mamba;
  DeviceMlp mlp;
  DeviceMoe moe;
};

// The bytes of every allocation of a DeviceWeights in host memory, in allocations() order: the weights of a backend
// asleep at level 1. Page-locked, so that the copies run at the bus's speed; a backend keeps its copy's memory from
// one sleep to the next, so that an RL loop that sleeps every step pins it once.
struct HostWeights {
  PinnedBuffer<std::byte> bytes;   // [sum of num_bytes]
  std::vector<int64_t> num_bytes;  // [allocations]; empty while it holds no weights
};

class DeviceWeights {
 public:
  DeviceWeights(const model::Model& model, WeightMode mode, cudaStream_t stream);
  // The weights saved by save(), from a DeviceWeights of the same model and mode, put back (the checkpoint unread).
  DeviceWeights(const model::Model& model, WeightMode mode, cudaStream_t stream, const HostWeights& saved);
  void save(HostWeights& into) const;  // into's memory reused when it is the right size

  // The bytes DeviceWeights(model, mode, ...) takes on the GPU, counted without a GPU (for memory plans).
  static int64_t bytes_needed(const model::Model& model, WeightMode mode);

  const float* embed_tokens = nullptr;  // [V, H] fp32 (the embedding lookup reads it)
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;  // [H]
  DeviceMatrix lm_head;               // [V, H]; the embedding itself when tied
  int64_t bytes_on_device = 0;

  // One weight allocation on the GPU.
  struct Allocation {
    const void* data;
    int64_t num_bytes;
  };
  // Every allocation, fp32 ones first, each kind in the order of loading: two loads of one model in one mode
  // list the same tensors in the same order (for tests that compare them byte for byte).
  std::vector<Allocation> allocations() const;

  // Writes an update's new values over the weights they replace, converted as at load (A_log to -exp(A_log),
  // gate_proj and up_proj into their stacked matrix, a tied embedding into lm_head too), in place: the pointers above,
  // and the CUDA graphs that hold them, stay valid. Every value is checked first (the f16 mode refuses one beyond
  // half's range, naming the tensor), so an update that throws has written nothing.
  void update(const model::WeightUpdate& update);

 private:
  // A copy of a host tensor on the GPU, and how its values were converted: an update of the tensor goes the same way.
  enum class Conversion : uint8_t { F32, Sixteen, NegativeExp };
  struct Placement {
    Conversion conversion;
    void* out;  // [numel] of the tensor: fp32 (F32, NegativeExp) or the mode's 16-bit type (Sixteen)
  };
  void place(const TensorView& view, Conversion conversion, void* out);  // records a placement (not when counting)
  void put(const TensorView& values, const Placement& placement);        // values the way the placement was
  float* widen_within_f16(const TensorView& view);  // view as fp32 in staging_f32_, refused beyond half's range

  // What a construction does: upload the model's values, only allocate (values put back after), or only count.
  enum class Fill : uint8_t { Values, Nothing, CountOnly };
  DeviceWeights(const model::Model& model, WeightMode mode, cudaStream_t stream, Fill fill);
  void load(const model::Model& model);
  const float* upload_vector(const TensorView& view);  // fp32 copy; null for an empty view
  DType matrix_dtype(DType stored) const;              // a GEMM matrix's type on the GPU in this mode
  DeviceMatrix upload_matrix(const TensorView& view);  // in the mode's dtype
  DeviceMatrix upload_stacked(const TensorView& top, const TensorView& bottom);  // top's rows, then bottom's
  const void* const* upload_expert_table(const std::vector<DeviceMlp>& experts,
                                         const std::vector<model::MlpWeights>& host_experts);
  const float* upload_as_f32(const TensorView& view);      // one upload per host pointer and shape
  const void* upload_as_16(const TensorView& view);        // likewise, 16-bit: as stored, or f16 in the f16 mode
  void put_as_f32(const TensorView& view, float* out);     // out[numel] = the view's elements as fp32
  void put_as_f16(const TensorView& view, uint16_t* out);  // out[numel] = the view's elements as IEEE half
  void put_as_16(const TensorView& view, uint16_t* out);   // as stored, or as IEEE half in the f16 mode
  const float* negative_exp(const TensorView& a_log);      // -exp(A_log), fp32
  void put_stored(const TensorView& view, void* out);      // out[numel] = the view's elements as stored

  WeightMode mode_;
  cudaStream_t stream_;
  const model::RandomWeights* random_recipe_ = nullptr;  // set when the views hold no host data
  bool count_only_ = false;   // bytes_on_device only: nothing allocated or copied, pointers stay null
  bool fill_values_ = true;   // false: allocated, the values left to the caller
  std::vector<DeviceBuffer<float>> owned_;
  std::vector<DeviceBuffer<uint16_t>> owned_16_;                        // 16-bit matrices of the 16-bit modes
  std::vector<DeviceBuffer<const void*>> expert_tables_;                // DeviceMoe::expert_matrices
  DeviceBuffer<uint16_t> staging_;                                      // a 16-bit tensor on its way to fp32
  DeviceBuffer<float> staging_f32_;                                     // a tensor on its way to f16
  std::map<std::pair<const void*, int64_t>, const float*> uploaded_;    // (host data, numel) -> fp32 copy
  std::map<std::pair<const void*, int64_t>, const void*> uploaded_16_;  // (host data, numel) -> 16-bit copy
  std::multimap<std::pair<const void*, int64_t>, Placement> placements_;  // (host data, numel) -> every copy
};

}  // namespace jambo::backend::cuda
