// Seeded random weights scaled like a trained Jamba, for benchmarks and tests without a checkpoint.
// Each tensor is filled in fixed-size chunks, each chunk from its own seed (derived from the model
// seed, the tensor name and the chunk index), so the bytes do not depend on the thread count.
#include "core/error.h"
#include "model/weight_layout.h"

#include <cmath>
#include <memory>

namespace jambo {
namespace {

constexpr int64_t kChunkElements = int64_t(1) << 16;
// Logits have about this standard deviation, so next-token distributions are peaked.
constexpr float kLogitStd = 4.0f;
// A uniform variable on [-a, a] has standard deviation a / sqrt(3).
const float kSqrt3 = std::sqrt(3.0f);

struct RandomStorage {
  std::vector<std::unique_ptr<std::byte[]>> buffers;  // one per tensor
};

// splitmix64: a fast generator whose outputs are well mixed even for adjacent seeds.
uint64_t next_random(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform on [-1, 1) from the top 24 bits.
float uniform_symmetric(uint64_t bits) { return float(bits >> 40) * (1.0f / 8388608.0f) - 1.0f; }

uint64_t hash_name(const std::string& name) {  // FNV-1a
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : name) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

// IEEE half from float, rounding to nearest even (subnormals, overflow to inf, NaN kept).
f16 to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return f16{uint16_t(sign | 0x7e00)};
  if (magnitude >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00)};  // rounds beyond 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal, counted in units of 2^-24
    return f16{uint16_t(sign | uint16_t(std::nearbyint(std::fabs(value) * 16777216.0f)))};
  }
  uint32_t rebiased = magnitude - (112u << 23);  // exponent bias 127 -> 15
  rebiased += 0xfffu + ((rebiased >> 13) & 1u);
  return f16{uint16_t(sign | (rebiased >> 13))};
}

template <typename T>
T from_float(float value);
template <>
float from_float<float>(float value) { return value; }
template <>
bf16 from_float<bf16>(float value) { return to_bf16(value); }
template <>
f16 from_float<f16>(float value) { return to_f16(value); }

// How one tensor's elements are drawn.
struct Initializer {
  WeightRole role;
  float amplitude;  // half-width of the uniform noise
  int64_t cols;     // last dimension

  float value(int64_t index, float noise) const {
    switch (role) {
      case WeightRole::Norm:
      case WeightRole::SkipD: return 1.0f + amplitude * noise;
      case WeightRole::ALog: return std::log(float(index % cols + 1));  // A = -(1..N), as Mamba
      case WeightRole::DtBias: return inverse_softplus_of_time_step(noise);
      default: return amplitude * noise;
    }
  }

  // Mamba's init: dt log-uniform in [1e-3, 1e-1]; the bias is softplus^-1(dt).
  static float inverse_softplus_of_time_step(float noise) {
    const float fraction = 0.5f * (noise + 1.0f);
    const float dt = std::exp(std::log(1e-3f) + fraction * (std::log(1e-1f) - std::log(1e-3f)));
    return dt + std::log(-std::expm1(-dt));
  }
};

Initializer make_initializer(const WeightSlot& slot, const JambaConfig& config) {
  const int64_t fan_in = slot.shape.back();
  const float unit_std = kSqrt3;  // amplitude giving standard deviation 1
  const float logit_scale = kSqrt3 * kLogitStd / std::sqrt(float(config.hidden_size));
  float amplitude = 0.0f;
  switch (slot.role) {
    case WeightRole::Embedding:
      amplitude = config.tie_word_embeddings ? logit_scale : unit_std;
      break;
    case WeightRole::LmHead: amplitude = logit_scale; break;
    case WeightRole::Linear: amplitude = unit_std / std::sqrt(float(fan_in)); break;
    case WeightRole::Norm:
    case WeightRole::SkipD:
    case WeightRole::Bias: amplitude = 0.1f; break;
    case WeightRole::DtBias:
    case WeightRole::ALog: break;
  }
  return Initializer{slot.role, amplitude, fan_in};
}

template <typename T>
void fill_chunk(T* out, int64_t begin, int64_t end, const Initializer& init, uint64_t seed) {
  uint64_t state = seed;
  for (int64_t i = begin; i < end; ++i) {
    out[i] = from_float<T>(init.value(i, uniform_symmetric(next_random(state))));
  }
}

struct Chunk {
  const WeightSlot* slot;
  Initializer init;
  int64_t begin, end;  // element range
  uint64_t seed;
};

void fill(const Chunk& chunk, DType dtype) {
  void* data = const_cast<void*>(chunk.slot->target->data);
  switch (dtype) {
    case DType::F32: fill_chunk(static_cast<float*>(data), chunk.begin, chunk.end, chunk.init, chunk.seed); break;
    case DType::BF16: fill_chunk(static_cast<bf16*>(data), chunk.begin, chunk.end, chunk.init, chunk.seed); break;
    case DType::F16: fill_chunk(static_cast<f16*>(data), chunk.begin, chunk.end, chunk.init, chunk.seed); break;
  }
}

}  // namespace

Model make_random_model(const JambaConfig& config, DType dtype, uint64_t seed) {
  Model model;
  model.config = config;
  model.config.finalize("random model config");
  auto storage = std::make_shared<RandomStorage>();
  const std::vector<WeightSlot> slots = list_weight_slots(model.config, model.weights);

  std::vector<Chunk> chunks;
  for (const WeightSlot& slot : slots) {
    TensorView& view = *slot.target;
    view.dtype = dtype;
    view.shape = slot.shape;
    view.name = slot.name;
    const int64_t numel = view.numel();
    storage->buffers.emplace_back(new std::byte[numel * dtype_size(dtype)]);
    view.data = storage->buffers.back().get();
    const Initializer init = make_initializer(slot, model.config);
    uint64_t tensor_seed = seed ^ hash_name(slot.name);
    const uint64_t chunk_seed_base = next_random(tensor_seed);
    for (int64_t begin = 0; begin < numel; begin += kChunkElements) {
      uint64_t chunk_state = chunk_seed_base + uint64_t(begin);
      chunks.push_back(Chunk{&slot, init, begin, std::min(numel, begin + kChunkElements),
                             next_random(chunk_state)});
    }
  }
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t i = 0; i < chunks.size(); ++i) fill(chunks[i], dtype);

  if (model.config.tie_word_embeddings) model.weights.lm_head = model.weights.embed_tokens;
  model.weights.bytes_total = total_weight_bytes(slots);
  model.storage = std::move(storage);
  return model;
}

}  // namespace jambo
