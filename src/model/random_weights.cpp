// Seeded random weights scaled like a trained Jamba, for benchmarks and tests without a checkpoint.
// Element i of a tensor is a function of (model seed, tensor name, i) only (random_values.h), so the bytes do
// not depend on the thread count, on how the work is split into chunks, or on whether the GPU makes them.
#include "model/random_weights.h"

#include "core/error.h"
#include "model/weight_layout.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <memory>

namespace jambo::model {
namespace {

constexpr int64_t kChunkElements = int64_t(1) << 16;  // the unit of parallel work
constexpr int64_t kTensorAlignment = 64;              // a cache line, for vector loads
// Logits have about this standard deviation, so next-token distributions are peaked.
constexpr float kLogitStd = 4.0f;
// A uniform variable on [-a, a] has standard deviation a / sqrt(3).
const float kSqrt3 = std::sqrt(3.0f);

// One anonymous mapping for all tensors. Readable storage is backed by huge pages where the kernel allows
// (filling hundreds of MB page by page would otherwise spend most of its time in page faults); an unreadable
// one only reserves addresses, for the views of a described model, and takes no memory.
class WeightAddressRange {
 public:
  WeightAddressRange(int64_t num_bytes, bool readable) : num_bytes_(std::max<int64_t>(num_bytes, 1)) {
    const int protection = readable ? PROT_READ | PROT_WRITE : PROT_NONE;
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (readable ? 0 : MAP_NORESERVE);
    data_ = ::mmap(nullptr, size_t(num_bytes_), protection, flags, -1, 0);
    JAMBO_REQUIRE(data_ != MAP_FAILED, "cannot {} {} bytes for random weights", readable ? "allocate" : "reserve",
                  num_bytes_);
    if (readable) ::madvise(data_, size_t(num_bytes_), MADV_HUGEPAGE);  // a hint; failure is harmless
  }
  ~WeightAddressRange() { ::munmap(data_, size_t(num_bytes_)); }
  WeightAddressRange(const WeightAddressRange&) = delete;
  WeightAddressRange& operator=(const WeightAddressRange&) = delete;

  std::byte* at(int64_t offset) const { return static_cast<std::byte*>(data_) + offset; }

 private:
  void* data_;
  int64_t num_bytes_;
};

int64_t aligned_size(int64_t num_bytes) {
  return (num_bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
}

uint64_t hash_name(const std::string& name) {  // FNV-1a
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : name) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

template <typename T>
T from_float(float value);
template <>
float from_float<float>(float value) {
  return value;
}
template <>
bf16 from_float<bf16>(float value) {
  return to_bf16(value);
}
template <>
f16 from_float<f16>(float value) {
  return to_f16(value);
}

// Element `index` of ALog or DtBias, which need log and exp: made on the host only (random_values.h says why).
float transcendental_value(const RandomInitializer& init, uint64_t stream, int64_t index) {
  if (init.kind == RandomInitializer::Kind::ALog) return std::log(float(index % init.cols + 1));
  const float fraction = 0.5f * (uniform_symmetric(random_bits(stream, index)) + 1.0f);
  const float dt = std::exp(std::log(1e-3f) + fraction * (std::log(1e-1f) - std::log(1e-3f)));
  return dt + std::log(-std::expm1(-dt));
}

RandomInitializer make_initializer(const WeightSlot& slot, const JambaConfig& config) {
  using Kind = RandomInitializer::Kind;
  const int64_t fan_in = slot.shape.back();
  const float unit_std = kSqrt3;  // amplitude giving standard deviation 1
  const float logit_scale = kSqrt3 * kLogitStd / std::sqrt(float(config.hidden_size));
  const bool tied = config.tie_word_embeddings;
  switch (slot.role) {
    case WeightRole::Embedding:
      return {Kind::Affine, 0.0f, tied ? logit_scale : unit_std, fan_in};
    case WeightRole::LmHead:
      return {Kind::Affine, 0.0f, logit_scale, fan_in};
    case WeightRole::Linear:
      return {Kind::Affine, 0.0f, unit_std / std::sqrt(float(fan_in)), fan_in};
    case WeightRole::Bias:
      return {Kind::Affine, 0.0f, 0.1f, fan_in};
    case WeightRole::Norm:
    case WeightRole::SkipD:
      return {Kind::Affine, 1.0f, 0.1f, fan_in};
    // With a tied head, random signs stop the residual's own token embedding from scoring that
    // token highest, which would make greedy decoding repeat one token.
    case WeightRole::FinalNorm:
      return {tied ? Kind::RandomSign : Kind::Affine, 1.0f, 0.1f, fan_in};
    case WeightRole::DtBias:
      return {Kind::DtBias, 0.0f, 0.0f, fan_in};
    case WeightRole::ALog:
      return {Kind::ALog, 0.0f, 0.0f, fan_in};
  }
  return {};
}

template <typename T>
void fill_range(T* out, int64_t begin, int64_t end, const RandomTensor& tensor) {
  const ElementMap& map = tensor.map;
  if (tensor.init.is_arithmetic()) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = from_float<T>(tensor.init.arithmetic_value(tensor.stream, map.source(i)));
    return;
  }
  for (int64_t i = begin; i < end; ++i)
    out[i] = from_float<T>(transcendental_value(tensor.init, tensor.stream, map.source(i)));
}

// One tensor of a random model: its name, how it is generated, and where its view points.
struct PlacedTensor {
  std::string name;
  RandomTensor tensor;
  std::byte* data;
};

struct RandomModelParts {
  Model model;
  std::vector<PlacedTensor> tensors;  // in list_weight_slots order
};

// A random model's views and address range (readable, or only reserved), without any values.
RandomModelParts random_model_skeleton(const JambaConfig& config, DType dtype, uint64_t seed, bool readable) {
  RandomModelParts parts;
  Model& model = parts.model;
  model.config = config;
  model.config.finalize("random model config");
  const std::vector<WeightSlot> slots = list_weight_slots(model.config, model.weights);
  std::vector<int64_t> offsets;
  int64_t num_bytes = 0;
  for (const WeightSlot& slot : slots) {
    int64_t numel = 1;
    for (int64_t extent : slot.shape) numel *= extent;
    const uint64_t stream = random_bits(seed, int64_t(hash_name(slot.name) >> 1));
    parts.tensors.push_back(
        {slot.name, RandomTensor{make_initializer(slot, model.config), stream, dtype, numel, {}}, nullptr});
    offsets.push_back(num_bytes);
    num_bytes += aligned_size(numel * dtype_size(dtype));
  }
  auto range = std::make_shared<WeightAddressRange>(num_bytes, readable);
  for (size_t i = 0; i < slots.size(); ++i) {
    parts.tensors[i].data = range->at(offsets[i]);
    *slots[i].target = TensorView{parts.tensors[i].data, dtype, slots[i].shape, slots[i].name};
  }
  if (model.config.tie_word_embeddings) model.weights.lm_head = model.weights.embed_tokens;
  model.weights.bytes_total = total_weight_bytes(slots);
  model.storage = std::move(range);
  return parts;
}

// A piece of one tensor, the unit of parallel work.
struct Chunk {
  void* data;
  const RandomTensor* tensor;
  int64_t begin, end;  // element range
};

}  // namespace

const RandomTensor& RandomWeights::tensor(const TensorView& view) const {
  const auto found = tensors_.find(view.name);
  JAMBO_REQUIRE(found != tensors_.end(), "the random weights have no tensor '{}'", view.name);
  JAMBO_REQUIRE(found->second.numel == view.numel() && found->second.dtype == view.dtype,
                "a view of random tensor '{}' has {} {} elements, the tensor {} {}", view.name, view.numel(),
                dtype_name(view.dtype), found->second.numel, dtype_name(found->second.dtype));
  return found->second;
}

RandomWeights RandomWeights::with(const std::unordered_map<std::string, RandomTensor>& replacements) const {
  std::unordered_map<std::string, RandomTensor> tensors = tensors_;
  for (const auto& [name, tensor] : replacements) tensors.at(name) = tensor;
  return RandomWeights(std::move(tensors));
}

void RandomWeights::fill_host(const RandomTensor& tensor, void* out, int64_t begin, int64_t end) {
  switch (tensor.dtype) {
    case DType::F32:
      fill_range(static_cast<float*>(out), begin, end, tensor);
      break;
    case DType::BF16:
      fill_range(static_cast<bf16*>(out), begin, end, tensor);
      break;
    case DType::F16:
      fill_range(static_cast<f16*>(out), begin, end, tensor);
      break;
  }
}

void require_host_data(const Model& model, std::string_view reader) {
  JAMBO_REQUIRE(model.has_host_data(),
                "{} reads the weights from host memory, but these random weights were only described for the CUDA "
                "backend, which generates them on the GPU (--random-weights with --backend cuda)",
                reader);
}

Model make_random_model(const JambaConfig& config, DType dtype, uint64_t seed) {
  RandomModelParts parts = random_model_skeleton(config, dtype, seed, /*readable=*/true);
  std::vector<Chunk> chunks;
  for (const PlacedTensor& placed : parts.tensors)
    for (int64_t begin = 0; begin < placed.tensor.numel; begin += kChunkElements)
      chunks.push_back(
          Chunk{placed.data, &placed.tensor, begin, std::min(placed.tensor.numel, begin + kChunkElements)});
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t i = 0; i < chunks.size(); ++i)
    RandomWeights::fill_host(*chunks[i].tensor, chunks[i].data, chunks[i].begin, chunks[i].end);
  return std::move(parts.model);
}

Model describe_random_model(const JambaConfig& config, DType dtype, uint64_t seed) {
  RandomModelParts parts = random_model_skeleton(config, dtype, seed, /*readable=*/false);
  std::unordered_map<std::string, RandomTensor> tensors;
  for (PlacedTensor& placed : parts.tensors) tensors.emplace(std::move(placed.name), placed.tensor);
  parts.model.random_recipe = std::make_shared<const RandomWeights>(std::move(tensors));
  return std::move(parts.model);
}

}  // namespace jambo::model
