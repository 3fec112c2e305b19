#include "backend/tensor_parallel_backend.h"

#include "backend/row_validation.h"
#include "core/error.h"
#include "model/tensor_parallel.h"
#include "model/weight_layout.h"
#include "model/weight_update.h"

#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace jambo::backend {
namespace {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& exception) {
    return exception.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Cutting a shard out of a tensor in GPU memory would need the GPU; a folder's tensors are cut on the host.
constexpr const char* kNoIpcUpdates =
    "weights from GPU memory (CUDA IPC) cannot be split over tensor-parallel ranks yet: send them as a checkpoint "
    "folder (/update_weights_from_disk)";

class TensorParallelBackend final : public Backend {
 public:
  TensorParallelBackend(const model::Model& model, const CacheConfig& cache, int64_t size, const MakeRank& make_rank,
                        AbortGroup abort_group, RankThreadSetup setup_thread)
      : whole_(model),
        config_(model.config),
        cache_(cache),
        abort_group_(std::move(abort_group)),
        setup_thread_(std::move(setup_thread)) {
    JAMBO_REQUIRE(size >= 1, "a tensor-parallel backend needs at least one rank, got {}", size);
    for (int64_t rank = 0; rank < size; ++rank) {
      shards_.push_back(model::shard_model(model, rank, size));
      ranks_.push_back(make_rank(rank, shards_.back()));
    }
    outputs_.resize(ranks_.size());
  }

  const model::JambaConfig& config() const override { return config_; }

  // Every rank runs the step on a thread of its own. The rows are checked first, once, so that bad rows fail on no
  // rank. A rank that fails anyway (out of memory, say) aborts the group, so that the others' collectives end rather
  // than wait for it; the step throws the first rank's error, and the backend, its ranks' states now apart, steps no
  // more.
  void forward(std::span<const BatchRow> rows, StepOutput& output) override {
    JAMBO_REQUIRE(failure_.empty(),
                  "a tensor-parallel rank failed in an earlier step ({}), which left the ranks' states apart: start "
                  "a new engine",
                  failure_);
    validate_rows(rows, config_,
                  {cache_.num_state_slots, cache_.num_kv_blocks, cache_.kv_block_size, cache_.num_checkpoints});
    const std::vector<StepOutput*> targets = outputs_for(output);
    std::mutex first_error_mutex;
    std::exception_ptr first_error;
    const auto run_rank = [&](size_t rank) {
      try {
        if (setup_thread_) setup_thread_(int64_t(rank));
        ranks_[rank]->forward(rows, *targets[rank]);
      } catch (...) {
        {
          const std::lock_guard lock(first_error_mutex);
          if (first_error == nullptr) first_error = std::current_exception();
        }
        abort_group_();
      }
    };
    std::vector<std::thread> threads;
    for (size_t rank = 1; rank < ranks_.size(); ++rank) threads.emplace_back(run_rank, rank);
    run_rank(0);
    for (std::thread& thread : threads) thread.join();
    if (first_error == nullptr) return;
    failure_ = message_of(first_error);
    std::rethrow_exception(first_error);
  }

  void copy_state(int64_t from_slot, int64_t to_slot) override {
    for (auto& rank : ranks_) rank->copy_state(from_slot, to_slot);
  }
  void copy_kv_block(int64_t from_block, int64_t to_block) override {
    for (auto& rank : ranks_) rank->copy_kv_block(from_block, to_block);
  }
  void poison_state(int64_t slot) override {
    for (auto& rank : ranks_) rank->poison_state(slot);
  }
  // The whole model's: every rank's share of a slot.
  int64_t state_elements_per_slot() const override {
    int64_t total = 0;
    for (const auto& rank : ranks_) total += rank->state_elements_per_slot();
    return total;
  }
  // The offset wrap, given for the whole slot, wraps each rank's pool at the same slot.
  void inject_faults(const FaultInjection& faults) override {
    const int64_t num_slots = faults.state_offset_modulus / std::max<int64_t>(1, state_elements_per_slot());
    for (auto& rank : ranks_) {
      FaultInjection rank_faults = faults;
      rank_faults.state_offset_modulus = num_slots * rank->state_elements_per_slot();
      rank->inject_faults(rank_faults);
    }
  }
  // Each rank takes its shard of the new values: the pieces put into the whole model's views, every other view left
  // empty, sharded as at load (as host values, whether or not the model's weights are: random weights made on the
  // GPUs take updates too), and the shard's views of the pieces handed to the rank as the new values of its load-time
  // shard's views (which a CUDA rank finds its weights by), copied before this returns.
  void update_weights(const model::WeightUpdate& update) override {
    JAMBO_REQUIRE(!update.on_device, kNoIpcUpdates);
    model::Model updated = whole_;
    updated.random_recipe = nullptr;
    std::map<std::string, TensorView*> whole_slots = slots_by_name(updated);
    for (auto& [name, view] : whole_slots) *view = TensorView{};
    for (const model::WeightUpdate::Piece& piece : update.pieces) *whole_slots.at(piece.name) = piece.source;
    if (updated.config.tie_word_embeddings) updated.weights.lm_head = updated.weights.embed_tokens;
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      model::Model shard = model::shard_model(updated, int64_t(rank), int64_t(ranks_.size()));
      std::map<std::string, TensorView*> shard_slots = slots_by_name(shard);
      std::map<std::string, TensorView*> loaded_slots = slots_by_name(shards_[rank]);
      model::WeightUpdate share;
      for (const model::WeightUpdate::Piece& piece : update.pieces) {
        const TensorView& values = *shard_slots.at(piece.name);
        share.pieces.push_back({piece.name, values, *loaded_slots.at(piece.name)});
        share.num_bytes += values.numel() * dtype_size(values.dtype);
      }
      ranks_[rank]->update_weights(share);
    }
  }
  model::Checkpoint open_ipc_tensors(std::span<const IpcTensor>) override { fail(kNoIpcUpdates); }
  // All ranks or none: where a rank cannot sleep (no host memory for its weights' copy), those already asleep wake.
  void sleep(SleepLevel level) override {
    size_t num_asleep = 0;
    try {
      for (; num_asleep < ranks_.size(); ++num_asleep) ranks_[num_asleep]->sleep(level);
    } catch (...) {
      for (size_t rank = 0; rank < num_asleep; ++rank) ranks_[rank]->wake_up({.weights = true, .caches = true});
      throw;
    }
  }
  void wake_up(const WakeTags& tags) override {
    for (auto& rank : ranks_) rank->wake_up(tags);
  }

 private:
  static std::map<std::string, TensorView*> slots_by_name(model::Model& model) {
    std::map<std::string, TensorView*> slots;
    for (const model::WeightSlot& slot : model::list_weight_slots(model.config, model.weights))
      slots[slot.name] = slot.target;
    return slots;
  }

  // Rank 0 writes the step's output, the others their own.
  std::vector<StepOutput*> outputs_for(StepOutput& output) {
    std::vector<StepOutput*> targets = {&output};
    for (size_t rank = 1; rank < ranks_.size(); ++rank) targets.push_back(&outputs_[rank]);
    return targets;
  }

  model::Model whole_;  // the checkpoint's views, which each weight update's shards are cut from
  model::JambaConfig config_;
  CacheConfig cache_;
  std::vector<model::Model> shards_;             // [size] as loaded: the views each rank's weights were made from
  std::vector<std::unique_ptr<Backend>> ranks_;  // [size]
  AbortGroup abort_group_;
  RankThreadSetup setup_thread_;
  std::string failure_;  // the error of a step a rank failed in: the backend steps no more
  std::vector<StepOutput> outputs_;  // [size] ranks 1.. write theirs here
};

}  // namespace

std::unique_ptr<Backend> make_tensor_parallel_backend(const model::Model& model, const CacheConfig& cache,
                                                      int64_t size, const MakeRank& make_rank,
                                                      AbortGroup abort_group, RankThreadSetup setup_thread) {
  return std::make_unique<TensorParallelBackend>(model, cache, size, make_rank, std::move(abort_group),
                                                 std::move(setup_thread));
}

}  // namespace jambo::backend
