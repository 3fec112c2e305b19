// Seeded random weights scaled like a trained Jamba, for benchmarks and tests without a checkpoint.
// Element i of a tensor is a function of (model seed, tensor name, i) only, so the bytes do not
// depend on the thread count or on how the work is split into chunks.
#include "core/error.h"
#include "model/weight_layout.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace jambo {
namespace {

constexpr int64_t kChunkElements = int64_t(1) << 16;  // the unit of parallel work
constexpr int64_t kTensorAlignment = 64;              // a cache line, for vector loads
// Logits have about this standard deviation, so next-token distributions are peaked.
constexpr float kLogitStd = 4.0f;
// A uniform variable on [-a, a] has standard deviation a / sqrt(3).
const float kSqrt3 = std::sqrt(3.0f);

// One anonymous mapping for all tensors, backed by huge pages where the kernel allows: filling
// hundreds of MB page by page would otherwise spend most of its time in page faults.
class RandomStorage {
 public:
  explicit RandomStorage(int64_t num_bytes) : num_bytes_(std::max<int64_t>(num_bytes, 1)) {
    data_ = ::mmap(nullptr, size_t(num_bytes_), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    JAMBO_REQUIRE(data_ != MAP_FAILED, "cannot allocate {} bytes for random weights", num_bytes_);
    ::madvise(data_, size_t(num_bytes_), MADV_HUGEPAGE);  // a hint; failure is harmless
  }
  ~RandomStorage() { ::munmap(data_, size_t(num_bytes_)); }
  RandomStorage(const RandomStorage&) = delete;
  RandomStorage& operator=(const RandomStorage&) = delete;

  std::byte* at(int64_t offset) const { return static_cast<std::byte*>(data_) + offset; }

 private:
  void* data_;
  int64_t num_bytes_;
};

int64_t aligned_size(int64_t num_bytes) {
  return (num_bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
}

// Element `index` of a random stream: splitmix64's output function applied to a counter. Each
// element depends only on (stream, index), so fill loops have no carried state and vectorize.
uint64_t random_bits(uint64_t stream, int64_t index) {
  uint64_t z = stream + uint64_t(index + 1) * 0x9e3779b97f4a7c15ull;
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

template <typename T>
T from_float(float value);
template <>
float from_float<float>(float value) { return value; }
template <>
bf16 from_float<bf16>(float value) { return to_bf16(value); }
template <>
f16 from_float<f16>(float value) { return to_f16(value); }

// How one tensor's elements are drawn from uniform noise on [-1, 1).
struct Initializer {
  enum class Kind {
    Affine,      // offset + amplitude * noise
    ALog,        // log(1..N) along each row, as Mamba: A = -(1..N)
    DtBias,      // softplus^-1 of a time step log-uniform in [1e-3, 1e-1], as Mamba
    RandomSign,  // +-1
  };
  Kind kind = Kind::Affine;
  float offset = 0.0f;     // 1 for norm weights and D
  float amplitude = 0.0f;  // half-width of the uniform noise
  int64_t cols = 0;        // last dimension

  float special_value(int64_t index, float noise) const {
    if (kind == Kind::ALog) return std::log(float(index % cols + 1));
    if (kind == Kind::RandomSign) return noise < 0.0f ? -1.0f : 1.0f;
    const float fraction = 0.5f * (noise + 1.0f);
    const float dt = std::exp(std::log(1e-3f) + fraction * (std::log(1e-1f) - std::log(1e-3f)));
    return dt + std::log(-std::expm1(-dt));
  }
};

Initializer make_initializer(const WeightSlot& slot, const JambaConfig& config) {
  using Kind = Initializer::Kind;
  const int64_t fan_in = slot.shape.back();
  const float unit_std = kSqrt3;  // amplitude giving standard deviation 1
  const float logit_scale = kSqrt3 * kLogitStd / std::sqrt(float(config.hidden_size));
  const bool tied = config.tie_word_embeddings;
  switch (slot.role) {
    case WeightRole::Embedding: return {Kind::Affine, 0.0f, tied ? logit_scale : unit_std, fan_in};
    case WeightRole::LmHead: return {Kind::Affine, 0.0f, logit_scale, fan_in};
    case WeightRole::Linear: return {Kind::Affine, 0.0f, unit_std / std::sqrt(float(fan_in)), fan_in};
    case WeightRole::Bias: return {Kind::Affine, 0.0f, 0.1f, fan_in};
    case WeightRole::Norm:
    case WeightRole::SkipD: return {Kind::Affine, 1.0f, 0.1f, fan_in};
    // With a tied head, random signs stop the residual's own token embedding from scoring that
    // token highest, which would make greedy decoding repeat one token.
    case WeightRole::FinalNorm: return {tied ? Kind::RandomSign : Kind::Affine, 1.0f, 0.1f, fan_in};
    case WeightRole::DtBias: return {Kind::DtBias, 0.0f, 0.0f, fan_in};
    case WeightRole::ALog: return {Kind::ALog, 0.0f, 0.0f, fan_in};
  }
  return {};
}

template <typename T>
void fill_range(T* out, int64_t begin, int64_t end, const Initializer& init, uint64_t stream) {
  if (init.kind == Initializer::Kind::Affine) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = from_float<T>(init.offset + init.amplitude * uniform_symmetric(random_bits(stream, i)));
    return;
  }
  for (int64_t i = begin; i < end; ++i)
    out[i] = from_float<T>(init.special_value(i, uniform_symmetric(random_bits(stream, i))));
}

// A piece of one tensor, the unit of parallel work.
struct Chunk {
  void* data;
  Initializer init;
  int64_t begin, end;  // element range
  uint64_t stream;     // the tensor's random stream
};

void fill(const Chunk& chunk, DType dtype) {
  switch (dtype) {
    case DType::F32: fill_range(static_cast<float*>(chunk.data), chunk.begin, chunk.end, chunk.init, chunk.stream); break;
    case DType::BF16: fill_range(static_cast<bf16*>(chunk.data), chunk.begin, chunk.end, chunk.init, chunk.stream); break;
    case DType::F16: fill_range(static_cast<f16*>(chunk.data), chunk.begin, chunk.end, chunk.init, chunk.stream); break;
  }
}

}  // namespace

Model make_random_model(const JambaConfig& config, DType dtype, uint64_t seed) {
  Model model;
  model.config = config;
  model.config.finalize("random model config");
  const std::vector<WeightSlot> slots = list_weight_slots(model.config, model.weights);
  int64_t num_bytes = 0;
  for (const WeightSlot& slot : slots) {
    int64_t numel = 1;
    for (int64_t extent : slot.shape) numel *= extent;
    num_bytes += aligned_size(numel * dtype_size(dtype));
  }
  auto storage = std::make_shared<RandomStorage>(num_bytes);

  std::vector<Chunk> chunks;
  int64_t offset = 0;
  for (const WeightSlot& slot : slots) {
    std::byte* const data = storage->at(offset);
    *slot.target = TensorView{data, dtype, slot.shape, slot.name};
    const int64_t numel = slot.target->numel();
    offset += aligned_size(numel * dtype_size(dtype));
    const Initializer init = make_initializer(slot, model.config);
    const uint64_t stream = random_bits(seed, int64_t(hash_name(slot.name) >> 1));
    for (int64_t begin = 0; begin < numel; begin += kChunkElements)
      chunks.push_back(Chunk{data, init, begin, std::min(numel, begin + kChunkElements), stream});
  }
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t i = 0; i < chunks.size(); ++i) fill(chunks[i], dtype);

  if (model.config.tie_word_embeddings) model.weights.lm_head = model.weights.embed_tokens;
  model.weights.bytes_total = total_weight_bytes(slots);
  model.storage = std::move(storage);
  return model;
}

}  // namespace jambo
