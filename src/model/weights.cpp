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

// The tensors the model reads, each once (a fused expert tensor serves every expert), in the order of loading.
class UsedTensors {
 public:
  void add(const std::string& name) {
    if (names_.insert(name).second) in_order_.push_back(name);
  }
  bool contains(const std::string& name) const { return names_.contains(name); }
  const std::vector<std::string>& in_order() const { return in_order_; }

 private:
  std::set<std::string> names_;
  std::vector<std::string> in_order_;
};

// The slot's tensor under its per-expert name, or else its rows of the fused expert tensor.
TensorView resolve(const Checkpoint& checkpoint, const WeightSlot& slot, UsedTensors& used) {
  const bool use_fused = slot.fused && checkpoint.find(slot.name) == nullptr &&
                         checkpoint.find(slot.fused->name) != nullptr;
  if (!use_fused) {
    used.add(slot.name);
    return checkpoint.get(slot.name, slot.shape);
  }
  const FusedExpertSource& fused = *slot.fused;
  used.add(fused.name);
  return fused.rows_of(checkpoint.get(fused.name, fused.shape));
}

void warn_about_unused(const Checkpoint& checkpoint, const UsedTensors& used) {
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
  UsedTensors used;
  for (const WeightSlot& slot : slots) *slot.target = resolve(checkpoint, slot, used);
  if (model.config.tie_word_embeddings) model.weights.lm_head = model.weights.embed_tokens;
  checkpoint.require_finite(used.in_order());
  warn_about_unused(checkpoint, used);
  model.weights.bytes_total = total_weight_bytes(slots);
  model.storage = checkpoint.storage();
  return model;
}

}  // namespace jambo::model
