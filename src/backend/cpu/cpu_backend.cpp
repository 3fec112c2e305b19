#include "backend/cpu/cpu_backend.h"

#include "backend/cpu/attention.h"
#include "backend/cpu/ffn.h"
#include "backend/cpu/mamba.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/state_memory.h"
#include "backend/cpu/vector_ops.h"
#include "backend/communicator.h"
#include "backend/logits_ops.h"
#include "backend/routed_experts.h"
#include "backend/row_validation.h"
#include "backend/state_layout.h"
#include "backend/tensor_parallel_backend.h"
#include "core/error.h"
#include "model/weight_layout.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

namespace jambo::backend::cpu {
namespace {

using cpu::Matrix;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const model::Model& model, const CacheConfig& cache, std::unique_ptr<Communicator> communicator);

  const model::JambaConfig& config() const override { return model_.config; }
  void forward(std::span<const BatchRow> rows, StepOutput& output) override;
  void copy_state(int64_t from_slot, int64_t to_slot) override { states_.copy(from_slot, to_slot); }
  void copy_kv_block(int64_t from_block, int64_t to_block) override;
  void poison_state(int64_t slot) override { states_.poison(slot); }
  int64_t state_elements_per_slot() const override { return states_.elements_per_slot(); }
  void inject_faults(const FaultInjection& faults) override {
    faults_ = faults;
    states_.wrap_offsets_at(faults.state_offset_modulus);
  }
  void update_weights(const model::WeightUpdate& update) override;
  // The caches' pages go back to the system; DropWeights also forgets every update (the checkpoint's pages are the
  // file's, which the system may drop and read again).
  void sleep(backend::SleepLevel level) override;
  void wake_up(const backend::WakeTags&) override {}  // the caches come back zeroed as they are touched
  model::Checkpoint open_ipc_tensors(std::span<const backend::IpcTensor>) override {
    fail("the CPU backend cannot read tensors in GPU memory (CUDA IPC): serve with --backend cuda, or send the "
         "weights as a checkpoint folder (/update_weights_from_disk)");
  }

 private:
  void index_weights();  // weights_by_name_ from model_'s weights
  void validate(std::span<const BatchRow> rows) const;
  void embed(std::span<const BatchRow> rows);
  void run_layer(int64_t layer, std::span<const BatchRow> rows, const std::vector<int64_t>& first_tokens);
  void run_mixer(int64_t layer, std::span<const BatchRow> rows, const std::vector<int64_t>& first_tokens,
                 const Matrix& normed, Matrix& mixed);
  void compute_outputs(std::span<const BatchRow> rows, const std::vector<int64_t>& first_tokens,
                       StepOutput& output);
  void sum_over_ranks(Matrix& partial);  // a row-parallel output's partial sums, summed (one rank: as it is)

  model::Model model_;
  const model::ModelWeights checkpoint_weights_;        // model_'s weights before any update
  std::map<std::string, TensorView*> weights_by_name_;  // model_'s weights by per-expert checkpoint name
  // The memory of each weight an update replaced: a weight's values live in its latest update's copy, and a copy
  // goes once no weight's values are in it.
  std::map<std::string, std::shared_ptr<const std::vector<std::byte>>> updated_weights_;
  std::vector<int64_t> index_in_kind_;  // [L] index of each layer among the layers of its mixer kind
  std::vector<int64_t> moe_index_;      // [L] index of each layer among the MoE layers (-1: dense)
  std::vector<int32_t> routed_;         // [num_moe_layers, num_tokens, k] the step's routing, where a row asks
  const int64_t num_state_slots_;  // the slots rows run in; the checkpoints follow them in states_
  cpu::StatePool states_;
  cpu::KvCache kv_cache_;
  FaultInjection faults_;  // test-only; none by default
  // A tensor-parallel rank's: sums the row-parallel matrices' partial outputs.
  std::unique_ptr<Communicator> communicator_;
  // The step's activations, kept so that later steps and layers reuse their storage.
  Matrix hidden_;        // [num_tokens, H] the residual stream
  Matrix normed_;        // [num_tokens, H] its normalized copy, the input of a mixer or FFN
  Matrix update_;        // [num_tokens, H] the mixer's or FFN's output, added to hidden_
  Matrix final_normed_;       // [num_vectors, H] the normalized tokens whose logits are computed
  std::vector<float> logits_;  // [num_vectors, V]
};

CpuBackend::CpuBackend(const model::Model& model, const CacheConfig& cache,
                       std::unique_ptr<Communicator> communicator)
    : model_(model),
      checkpoint_weights_(model.weights),
      index_in_kind_(indices_within_kind(model.config)),
      moe_index_(moe_layer_indices(model.config)),
      num_state_slots_(cache.num_state_slots),
      states_(model.config, cache.num_state_slots + cache.num_checkpoints, cache.state_dtype),
      kv_cache_(model.config, cache),
      communicator_(std::move(communicator)) {
  index_weights();
}

void CpuBackend::index_weights() {
  weights_by_name_.clear();
  for (const model::WeightSlot& slot : model::list_weight_slots(model_.config, model_.weights))
    weights_by_name_[slot.name] = slot.target;
}

void CpuBackend::update_weights(const model::WeightUpdate& update) {
  auto copy = std::make_shared<std::vector<std::byte>>(size_t(update.num_bytes));
  int64_t offset = 0;
  for (const model::WeightUpdate::Piece& piece : update.pieces) {
    const int64_t num_bytes = piece.source.numel() * dtype_size(piece.source.dtype);
    const auto found = weights_by_name_.find(piece.name);
    // read_weight_update names the model's weights only, and counts their bytes.
    JAMBO_ASSERT(found != weights_by_name_.end() && offset + num_bytes <= update.num_bytes);
    std::memcpy(copy->data() + offset, piece.source.data, size_t(num_bytes));
    found->second->data = copy->data() + offset;
    updated_weights_[piece.name] = copy;
    offset += num_bytes;
  }
  if (model_.config.tie_word_embeddings) model_.weights.lm_head = model_.weights.embed_tokens;
}

void CpuBackend::sleep(backend::SleepLevel level) {
  states_.discard();
  kv_cache_.discard();
  if (level == backend::SleepLevel::DropWeights) {
    model_.weights = checkpoint_weights_;
    index_weights();
    updated_weights_.clear();
  }
}

void CpuBackend::validate(std::span<const BatchRow> rows) const {
  validate_rows(rows, model_.config,
                {num_state_slots_, kv_cache_.num_blocks(), kv_cache_.block_size(), states_.num_slots() - num_state_slots_});
}

void CpuBackend::copy_kv_block(int64_t from_block, int64_t to_block) {
  for (int64_t block : {from_block, to_block}) require_kv_block(block, kv_cache_.num_blocks());
  // The keys (and the values) of one layer in one block are contiguous: [kv_block_size, nkv, hd].
  const int64_t num_floats = element_offset(kv_cache_.block_size(), model_.config.num_key_value_heads * model_.config.head_dim);
  for (int64_t layer = 0; layer < model_.config.num_attention_layers(); ++layer) {
    std::copy_n(kv_cache_.key(from_block, layer, 0), num_floats, kv_cache_.key(to_block, layer, 0));
    std::copy_n(kv_cache_.value(from_block, layer, 0), num_floats, kv_cache_.value(to_block, layer, 0));
  }
}

void CpuBackend::embed(std::span<const BatchRow> rows) {
  const TensorView& table = model_.weights.embed_tokens;  // [V, H]
  const int64_t hidden_size = model_.config.hidden_size;
  std::vector<int32_t> tokens;  // [num_tokens] the step's tokens, row after row
  for (const BatchRow& row : rows) tokens.insert(tokens.end(), row.tokens.begin(), row.tokens.end());
  hidden_.resize(int64_t(tokens.size()), hidden_size);
  cpu::parallel_for(int64_t(tokens.size()), hidden_size, [&](int64_t t) {
    const int64_t first = element_offset(tokens[t], hidden_size);
    float* out = hidden_.row(t);
    for (int64_t i = 0; i < hidden_size; ++i) out[i] = table.at(first + i);
  });
}

void CpuBackend::run_mixer(int64_t layer, std::span<const BatchRow> rows, const std::vector<int64_t>& first_tokens,
                           const Matrix& normed, Matrix& mixed) {
  const model::LayerWeights& weights = model_.weights.layers[layer];
  const int64_t kind_index = index_in_kind_[layer];
  if (model_.config.mixer_kinds[layer] == model::MixerKind::Attention) {
    std::vector<cpu::AttentionRow> attention_rows;
    for (size_t r = 0; r < rows.size(); ++r)
      attention_rows.push_back({first_tokens[r], int64_t(rows[r].tokens.size()), rows[r].start_position,
                                rows[r].block_table});
    cpu::attention_mixer(weights.attention, model_.config, kv_cache_, kind_index, normed, attention_rows, mixed);
    return;
  }
  std::vector<cpu::MambaRow> mamba_rows;
  std::vector<std::vector<cpu::MambaCheckpoint>> checkpoints(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const bool reads_state =
        rows[r].has_initial_state || (faults_.decode_before_prefill && rows[r].tokens.size() == 1);
    for (const StateCheckpoint& checkpoint : rows[r].checkpoints)
      checkpoints[r].push_back({checkpoint.num_tokens, states_.conv_tail(checkpoint.slot, kind_index),
                                states_.ssm_state(checkpoint.slot, kind_index)});
    mamba_rows.push_back({first_tokens[r], int64_t(rows[r].tokens.size()), reads_state,
                          states_.conv_tail(rows[r].slot, kind_index), states_.ssm_state(rows[r].slot, kind_index),
                          checkpoints[r]});
  }
  cpu::mamba_mixer(weights.mamba, model_.config, normed, mamba_rows, mixed, communicator_.get());
}

void CpuBackend::sum_over_ranks(Matrix& partial) {
  if (communicator_ != nullptr)
    communicator_->all_reduce_sum({partial.data(), size_t(partial.num_rows() * partial.num_cols())});
}

// Pre-norm decoder layer (spec §3.2): h += mixer(norm(h)); h += ffn(norm(h)).
void CpuBackend::run_layer(int64_t layer, std::span<const BatchRow> rows, const std::vector<int64_t>& first_tokens) {
  const model::LayerWeights& weights = model_.weights.layers[layer];
  const float eps = float(model_.config.rms_norm_eps);
  cpu::rms_norm_rows(hidden_, weights.input_norm, eps, normed_);
  run_mixer(layer, rows, first_tokens, normed_, update_);
  sum_over_ranks(update_);
  cpu::add_in_place(hidden_, update_);

  cpu::rms_norm_rows(hidden_, weights.pre_ff_norm, eps, normed_);
  if (model_.config.ffn_kinds[layer] == model::FfnKind::Moe) {
    const int64_t k = model_.config.num_experts_per_tok;
    int32_t* routed = routed_.empty() ? nullptr : routed_.data() + moe_index_[layer] * normed_.num_rows() * k;
    cpu::sparse_moe(weights.moe, k, normed_, update_, routed);
  } else
    cpu::dense_mlp(weights.mlp, normed_, update_);
  sum_over_ranks(update_);
  cpu::add_in_place(hidden_, update_);
}

// Logits of each row's last token, or of every token (computes_all_vectors), then each row's output.
void CpuBackend::compute_outputs(std::span<const BatchRow> rows, const std::vector<int64_t>& first_tokens,
                                 StepOutput& output) {
  std::vector<int64_t> selected_tokens;  // [num_vectors] the tokens whose logits are computed
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t num_tokens = int64_t(rows[r].tokens.size());
    for (int64_t t = computes_all_vectors(rows[r]) ? 0 : num_tokens - 1; t < num_tokens; ++t)
      selected_tokens.push_back(first_tokens[r] + t);
  }
  const int64_t num_vectors = int64_t(selected_tokens.size());
  const int64_t vocab_size = model_.config.vocab_size;
  final_normed_.resize(num_vectors, hidden_.num_cols());
  cpu::parallel_for(num_vectors, hidden_.num_cols(), [&](int64_t v) {
    cpu::rms_norm(hidden_.row(selected_tokens[v]), model_.weights.final_norm, float(model_.config.rms_norm_eps),
                  final_normed_.row(v));
  });
  logits_.resize(size_t(element_offset(num_vectors, vocab_size)));  // matmul writes every value
  cpu::matmul(final_normed_.data(), num_vectors, model_.weights.lm_head, logits_.data());

  fill_step_output(rows, logits_, vocab_size, output);
}

void CpuBackend::forward(std::span<const BatchRow> rows, StepOutput& output) {
  validate(rows);
  std::vector<int64_t> first_tokens;  // [num_rows] index of each row's first token in the step
  int64_t num_tokens = 0;
  for (const BatchRow& row : rows) {
    first_tokens.push_back(num_tokens);
    num_tokens += int64_t(row.tokens.size());
  }
  embed(rows);
  const model::JambaConfig& config = model_.config;
  const bool wants_routing = any_row_wants_routing(rows);
  const int64_t num_moe_layers = config.num_moe_layers(), k = config.num_experts_per_tok;
  routed_.assign(wants_routing ? size_t(num_moe_layers * num_tokens * k) : 0, -1);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) run_layer(layer, rows, first_tokens);
  compute_outputs(rows, first_tokens, output);
  if (wants_routing) add_routed_experts(rows, {routed_, num_moe_layers, num_tokens, k}, output);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const model::Model& model, const CacheConfig& cache,
                                          std::unique_ptr<Communicator> communicator) {
  return std::make_unique<CpuBackend>(model, cache, std::move(communicator));
}

std::unique_ptr<Backend> make_tensor_parallel_cpu_backend(const model::Model& model, const CacheConfig& cache,
                                                          int64_t size) {
  std::vector<std::unique_ptr<Communicator>> group = make_in_process_group(size);
  Communicator* any_rank = group.front().get();  // an abort through any rank ends the group
  const auto make_rank = [&](int64_t rank, const model::Model& shard) {
    return make_cpu_backend(shard, cache, std::move(group[size_t(rank)]));
  };
  // Each rank's parallel loops get its share of the threads.
  const int threads_per_rank = std::max(1, omp_get_max_threads() / int(size));
  return make_tensor_parallel_backend(model, cache, size, make_rank, [any_rank] { any_rank->abort(); },
                                      [threads_per_rank](int64_t) { omp_set_num_threads(threads_per_rank); });
}

}  // namespace jambo::backend::cpu
