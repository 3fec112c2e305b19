// load_model: config.json + safetensors checkpoint -> ModelWeights (spec §2), shapes checked and values finite.
#include "model/weights.h"

#include "core/error.h"
#include "model/safetensors.h"
#include "model/weight_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

namespace jambo::model {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxUnusedNamesShown = 5;

// The checkpoint's tensor of that name and shape; its values are checked the first time it is used (a fused expert
// tensor is used by every expert), so each tensor's bytes are read once at load.
TensorView use(const Checkpoint& checkpoint, const std::string& name, const std::vector<int64_t>& shape,
               std::set<std::string>& used) {
  const TensorView view = checkpoint.get(name, shape);
  if (used.insert(name).second) checkpoint.require_finite(name);
  return view;
}

// The slot's tensor under its per-expert name, or else its rows of the fused expert tensor.
TensorView resolve(const Checkpoint& checkpoint, const WeightSlot& slot, std::set<std::string>& used) {
  const bool use_fused = slot.fused && checkpoint.find(slot.name) == nullptr &&
                         checkpoint.find(slot.fused->name) != nullptr;
  if (!use_fused) return use(checkpoint, slot.name, slot.shape, used);
  const FusedExpertSource& fused = *slot.fused;
  const TensorView stacked = use(checkpoint, fused.name, fused.shape, used);
  const int64_t rows_per_expert = fused.shape[1];
  return stacked.row_slice(fused.expert * rows_per_expert + fused.first_row, fused.num_rows);
}

void warn_about_unused(const Checkpoint& checkpoint, const std::set<std::string>& used) {
  std::vector<std::string> unused;
  for (const std::string& name : checkpoint.names())
    if (!used.contains(name)) unused.push_back(name);
  const size_t num_unused = unused.size();
  if (num_unused == 0) return;
  const bool more = num_unused > kMaxUnusedNamesShown;
  if (more) unused.resize(kMaxUnusedNamesShown);
  fmt::print(stderr, "warning: {}: {} tensors are not used by the model: {}{}\n", checkpoint.source(),
             num_unused, fmt::join(unused, ", "), more ? ", ..." : "");
}

}  // namespace

Model load_model(const fs::path& folder) {
  require_model_folder(folder);
  const fs::path config_path = folder / "config.json";
  JAMBO_REQUIRE(fs::exists(config_path), "{}: file not found", config_path.string());
  Model model;
  model.config = load_config(config_path);
  const Checkpoint checkpoint = Checkpoint::open(folder);

  const std::vector<WeightSlot> slots = list_weight_slots(model.config, model.weights);
  std::set<std::string> used;
  for (const WeightSlot& slot : slots) *slot.target = resolve(checkpoint, slot, used);
  if (model.config.tie_word_embeddings) model.weights.lm_head = model.weights.embed_tokens;
  warn_about_unused(checkpoint, used);
  model.weights.bytes_total = total_weight_bytes(slots);
  model.storage = checkpoint.storage();
  return model;
}

}  // namespace jambo::model
