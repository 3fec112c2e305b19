#include "model/tensor_parallel.h"

#include "core/error.h"
#include "model/random_weights.h"

#include <cstring>

namespace jambo::model {
namespace {

// The shard's own copies, beside a share of the model's storage.
struct ShardStorage {
  std::shared_ptr<void> model_storage;
  std::vector<std::vector<char>> copies;
};

// Slices of the model's views. Without values to copy (a described model, random weights without host data, or a
// shard of shapes only) a slice keeps the view's address, which stands for it; a described model's shard recipe maps
// the slice's elements to the tensor's.
class Slicer {
 public:
  Slicer(int64_t rank, int64_t size, ShardStorage& storage, const RandomWeights* recipe, bool copies)
      : rank_(rank), size_(size), storage_(storage), recipe_(recipe), copies_(copies) {}

  // The rank's share of a view's rows (dimension 0): a view.
  TensorView rows(const TensorView& view) const {
    return view.empty() ? view : rows_at(view, rank_ * (view.shape[0] / size_), view.shape[0] / size_);
  }

  // Rows [first, first + count) of a view of any rank: a view.
  TensorView rows_at(const TensorView& view, int64_t first, int64_t count) const {
    if (view.empty()) return view;
    const int64_t row_elements = view.numel() / view.shape[0];
    TensorView out = view;
    out.data = static_cast<const char*>(view.data) + element_offset(first, row_elements * dtype_size(view.dtype));
    out.shape[0] = count;
    describe(view, out, {.block = out.numel(), .block_offset = first * row_elements});
    return out;
  }

  // The rank's share of a 2-D view's columns: a copy.
  TensorView columns(const TensorView& view) const {
    if (view.empty()) return view;
    const int64_t width = view.cols() / size_, row_bytes = view.cols() * dtype_size(view.dtype);
    TensorView out = view;
    out.shape = {view.rows(), width};
    describe(view, out, {width, view.cols(), rank_ * width});
    if (!copies_) return out;
    const int64_t bytes = width * dtype_size(view.dtype);
    std::vector<char>& copy = storage_.copies.emplace_back(size_t(element_offset(view.rows(), bytes)));
    for (int64_t r = 0; r < view.rows(); ++r)
      std::memcpy(copy.data() + element_offset(r, bytes),
                  static_cast<const char*>(view.data) + element_offset(r, row_bytes) + element_offset(rank_, bytes),
                  size_t(bytes));
    out.data = copy.data();
    return out;
  }

  // The rank's share of each of a view's `parts` equal blocks of rows, joined: a copy (in_proj's u and z).
  TensorView rows_of_parts(const TensorView& view, int64_t parts) const {
    if (view.empty()) return view;
    const int64_t row_elements = view.numel() / view.shape[0];
    const int64_t part_rows = view.shape[0] / parts, share = part_rows / size_;
    TensorView out = view;
    out.shape[0] = share * parts;
    describe(view, out, {share * row_elements, part_rows * row_elements, rank_ * share * row_elements});
    if (!copies_) return out;
    const int64_t share_bytes = element_offset(share, row_elements * dtype_size(view.dtype));
    std::vector<char>& copy = storage_.copies.emplace_back(size_t(share_bytes * parts));
    for (int64_t p = 0; p < parts; ++p)
      std::memcpy(copy.data() + element_offset(p, share_bytes),
                  rows_at(view, p * part_rows + rank_ * share, share).data, size_t(share_bytes));
    out.data = copy.data();
    return out;
  }

  TensorView on_rank_zero(const TensorView& view) const { return rank_ == 0 ? view : TensorView{}; }

  // The shard's recipe: the model's, with the slices described so far (null for a model with host data).
  std::shared_ptr<const RandomWeights> shard_recipe() const {
    return recipe_ == nullptr ? nullptr : std::make_shared<const RandomWeights>(recipe_->with(slices_));
  }

 private:
  // A described model's recipe learns that `slice` is cut from `view` as `map` says.
  void describe(const TensorView& view, const TensorView& slice, ElementMap map) const {
    if (recipe_ == nullptr) return;
    RandomTensor tensor = recipe_->tensor(view);
    tensor.numel = slice.numel();
    tensor.map = map;
    slices_[slice.name] = tensor;
  }

  int64_t rank_, size_;
  ShardStorage& storage_;
  const RandomWeights* recipe_;
  bool copies_;
  mutable std::unordered_map<std::string, RandomTensor> slices_;  // by name
};

MlpWeights shard_mlp(const MlpWeights& mlp, const Slicer& slice) {
  return {slice.rows(mlp.gate_proj), slice.rows(mlp.up_proj), slice.columns(mlp.down_proj)};
}

MambaWeights shard_mamba(const MambaWeights& mamba, const Slicer& slice) {
  MambaWeights out = mamba;  // the dt, B and C norms are replicated
  out.in_proj = slice.rows_of_parts(mamba.in_proj, 2);
  out.in_proj_bias = slice.rows_of_parts(mamba.in_proj_bias, 2);
  out.conv_weight = slice.rows(mamba.conv_weight);
  out.conv_bias = slice.rows(mamba.conv_bias);
  out.x_proj = slice.columns(mamba.x_proj);
  out.dt_proj = slice.rows(mamba.dt_proj);
  out.dt_proj_bias = slice.rows(mamba.dt_proj_bias);
  out.A_log = slice.rows(mamba.A_log);
  out.D = slice.rows(mamba.D);
  out.out_proj = slice.columns(mamba.out_proj);
  out.out_proj_bias = slice.on_rank_zero(mamba.out_proj_bias);
  return out;
}

// KV heads split with their query heads, or the one a rank's query heads read where there are fewer than ranks.
AttentionWeights shard_attention(const AttentionWeights& attention, const JambaConfig& config, int64_t rank,
                                 int64_t size, const Slicer& slice) {
  AttentionWeights out;
  out.q_proj = slice.rows(attention.q_proj);
  out.o_proj = slice.columns(attention.o_proj);
  if (config.num_key_value_heads % size == 0) {
    out.k_proj = slice.rows(attention.k_proj);
    out.v_proj = slice.rows(attention.v_proj);
  } else {
    const int64_t group = config.num_attention_heads / config.num_key_value_heads;
    const int64_t kv_head = rank * (config.num_attention_heads / size) / group;
    out.k_proj = slice.rows_at(attention.k_proj, kv_head * config.head_dim, config.head_dim);
    out.v_proj = slice.rows_at(attention.v_proj, kv_head * config.head_dim, config.head_dim);
  }
  return out;
}

}  // namespace

std::string tensor_parallel_obstacle(const JambaConfig& config, int64_t size) {
  if (size < 1) return fmt::format("the tensor-parallel size must be at least 1, got {}", size);
  if (config.num_mamba_layers() > 0 && config.mamba_d_inner % size != 0)
    return fmt::format("{} ranks do not divide the {} Mamba channels (mamba_d_inner)", size, config.mamba_d_inner);
  if (config.intermediate_size % size != 0)
    return fmt::format("{} ranks do not divide the intermediate size {}", size, config.intermediate_size);
  if (config.num_attention_layers() == 0) return "";
  if (config.num_attention_heads % size != 0)
    return fmt::format("{} ranks do not divide the {} attention heads", size, config.num_attention_heads);
  if (config.num_key_value_heads % size != 0 && size % config.num_key_value_heads != 0)
    return fmt::format("{} ranks neither divide nor are divided by the {} KV heads", size,
                       config.num_key_value_heads);
  return "";
}

Model shard_model(const Model& model, int64_t rank, int64_t size, ShardContents contents) {
  const JambaConfig& config = model.config;
  const std::string obstacle = tensor_parallel_obstacle(config, size);
  JAMBO_REQUIRE(obstacle.empty(), "cannot shard the model: {}", obstacle);
  JAMBO_REQUIRE(rank >= 0 && rank < size, "rank {} is outside 0..{}", rank, size - 1);
  auto storage = std::make_shared<ShardStorage>();
  storage->model_storage = model.storage;
  const Slicer slice(rank, size, *storage, model.random_recipe.get(),
                     model.has_host_data() && contents == ShardContents::Values);

  Model shard;
  shard.config = config;
  shard.config.mamba_d_inner = config.mamba_d_inner / size;
  shard.config.intermediate_size = config.intermediate_size / size;
  shard.config.num_attention_heads = config.num_attention_heads / size;
  shard.config.num_key_value_heads = std::max<int64_t>(1, config.num_key_value_heads / size);
  shard.weights = model.weights;
  for (LayerWeights& layer : shard.weights.layers) {
    if (layer.mixer == MixerKind::Attention)
      layer.attention = shard_attention(layer.attention, config, rank, size, slice);
    else
      layer.mamba = shard_mamba(layer.mamba, slice);
    if (layer.ffn == FfnKind::Moe)
      for (MlpWeights& expert : layer.moe.experts) expert = shard_mlp(expert, slice);
    else
      layer.mlp = shard_mlp(layer.mlp, slice);
  }
  shard.storage = storage;
  shard.random_recipe = slice.shard_recipe();
  return shard;
}

}  // namespace jambo::model
