#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/device_communicator.h"
#include "backend/cuda/embedding_norm.h"
#include "backend/cuda/ffn.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ipc_tensors.h"
#include "backend/cuda/logits_outputs.h"
#include "backend/cuda/mixers.h"
#include "backend/cuda/step_graphs.h"
#include "backend/cuda/step_rows.h"
#include "backend/routed_experts.h"
#include "backend/row_validation.h"
#include "backend/state_layout.h"
#include "backend/tensor_parallel_backend.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <initializer_list>
#include <vector>

namespace jambo::backend::cuda {
namespace {

// The step's activations, grown on demand and kept across steps.
struct Activations {
  DeviceBuffer<float> hidden;        // [T, H] the residual stream
  DeviceBuffer<float> normed;        // [T, H] the input of a mixer or FFN
  DeviceBuffer<float> update;        // [T, H] the mixer's or FFN's output
  DeviceBuffer<float> final_normed;  // [num_vectors, H]
  DeviceBuffer<float> logits;        // [num_vectors, V]
  // The norms' outputs rounded for the 16-bit GEMMs they feed (16-bit modes).
  DeviceBuffer<uint16_t> normed16;        // [T, H]
  DeviceBuffer<uint16_t> final_normed16;  // [num_vectors, H]
  DeviceBuffer<int32_t> routed_experts;   // [num_moe_layers, T, k] each MoE layer's choices (return_routed_experts)
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const model::Model& model, const CacheConfig& cache, WeightMode mode, bool decode_graphs,
              bool invariant_gemm, std::unique_ptr<DeviceCommunicator> communicator);
  ~CudaBackend() override;

  const model::JambaConfig& config() const override { return config_; }
  void forward(std::span<const BatchRow> rows, StepOutput& output) override;
  void copy_state(int64_t from_slot, int64_t to_slot) override;
  void copy_kv_block(int64_t from_block, int64_t to_block) override;
  void poison_state(int64_t slot) override;  // every public call runs on the backend's GPU (DeviceScope)
  int64_t state_elements_per_slot() const override { return slot_layout_.slot_stride; }
  int64_t graph_replays() const { return graphs_ == nullptr ? 0 : graphs_->counts().num_replays; }
  double layers_gpu_seconds() const { return layers_gpu_seconds_; }
  void inject_faults(const FaultInjection& faults) override {
    require_state_offset_modulus(faults.state_offset_modulus, slot_layout_.slot_stride, cache_.num_state_slots);
    faults_ = faults;
  }
  // On the backend's stream, after the steps before it: in place, so the captured decode graphs replay the new weights.
  void update_weights(const model::WeightUpdate& update) override {
    const DeviceScope scope(device_);
    weights_->update(update);
  }
  model::Checkpoint open_ipc_tensors(std::span<const IpcTensor> tensors) override {
    const DeviceScope scope(device_);
    return cuda::open_ipc_tensors(tensors);
  }
  void sleep(SleepLevel level) override;
  void wake_up(const WakeTags& tags) override;

 private:
  int64_t slot_offset(int64_t slot) const;  // element offset of a slot, through the test-only wrap
  StateValues state_pool() const { return {states_.data(), cache_.state_dtype}; }
  StateValues slot_values(int64_t slot) const { return state_pool() + slot_offset(slot); }  // from its first element
  int64_t slot_bytes() const { return slot_layout_.pool_bytes(1, cache_.state_dtype); }
  void reserve_activations(int64_t num_tokens, int64_t num_vectors);
  bool runs_as_graph(const DeviceRows& rows) const;
  void enqueue_layers(const DeviceRows& rows);  // embedding to logits: launches only, no host synchronization
  void save_checkpoints_at_row_ends(std::span<const BatchRow> rows);
  // The step's routing into the outputs of the rows that ask (after the step).
  void add_routing(std::span<const BatchRow> rows, int64_t num_tokens, StepOutput& output) const;
  Narrow16 narrow_copy(DeviceBuffer<uint16_t>& buffer) const;  // absent in the f32 mode
  // The fp32 normed buffer where the layer's mixer or FFN reads it, else null: the norm writes only the rounded copy.
  float* normed_for_mixer(int64_t layer);
  float* normed_for_ffn(int64_t layer);
  float* normed_unless_copy_suffices(std::initializer_list<const DeviceMatrix*> readers);
  void sum_over_ranks(float* values, int64_t count);  // a row-parallel output's partial sums (one rank: as they are)
  void run_mamba(int64_t layer, const DeviceRows& rows);
  void run_attention(int64_t layer, const DeviceRows& rows);
  KvLayout kv_layout(int64_t attention_layer) const;
  void allocate_caches();  // the state pool and KV cache, zeroed; the GEMMs' handles and the graph recorder
  void release_device_memory();  // all but the few buffers of a step's rows and results

  std::unique_ptr<DeviceCommunicator> communicator_;  // a tensor-parallel rank's, or null
  int device_;                                        // the GPU of every buffer and launch: the communicator's, or 0
  model::Model model_;  // the checkpoint that a wake from level 2 reads again
  model::JambaConfig config_;
  CacheConfig cache_;
  WeightMode mode_;
  bool decode_graphs_, invariant_gemm_;
  HostWeights host_weights_;  // the weights while asleep at level 1; its memory kept for the next sleep
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<DeviceWeights> weights_;
  std::vector<int64_t> index_in_kind_;  // [L] index of each layer among the layers of its mixer kind
  std::vector<int64_t> moe_index_;      // [L] index of each layer among the MoE layers (-1: dense)
  StateSlotLayout slot_layout_;
  DeviceBuffer<std::byte> states_;  // [num_slots, num_mamba_layers, Di * (K-1 + N)] of cache_.state_dtype
  int64_t kv_block_stride_ = 0;     // num_attention_layers * 2 * kv_block_size * nkv * hd
  DeviceBuffer<float> kv_cache_;    // [num_kv_blocks, num_attention_layers, 2, kv_block_size, nkv, hd]
  FaultInjection faults_;           // test-only; none by default
  StepRowsUploader uploader_;
  Activations activations_;
  MambaScratch mamba_scratch_;
  AttentionScratch attention_scratch_;
  FfnWorkspace ffn_workspace_;
  LogitsOutputs logits_outputs_;
  std::unique_ptr<StepGraphs> graphs_;  // null: every step runs launch by launch
  DType narrow_dtype_ = DType::F32;     // the 16-bit GEMM weights' type (16-bit modes), F32 for none
  cudaEvent_t layers_start_ = nullptr, layers_end_ = nullptr;  // around each step's layers
  double layers_gpu_seconds_ = 0.0;
};

CudaBackend::CudaBackend(const model::Model& model, const CacheConfig& cache, WeightMode mode, bool decode_graphs,
                         bool invariant_gemm, std::unique_ptr<DeviceCommunicator> communicator)
    : communicator_(std::move(communicator)),
      device_(communicator_ == nullptr ? 0 : communicator_->device()),
      model_(model),
      config_(model.config),
      cache_(cache),
      mode_(mode),
      // A communicator that synchronizes the host inside a step cannot be recorded into a graph.
      decode_graphs_(decode_graphs && (communicator_ == nullptr || communicator_->capturable())),
      invariant_gemm_(invariant_gemm),
      index_in_kind_(indices_within_kind(model.config)),
      moe_index_(moe_layer_indices(model.config)),
      slot_layout_(model.config) {
  JAMBO_REQUIRE(cache.num_state_slots > 0, "the recurrent-state pool needs at least one slot, got {}",
                cache.num_state_slots);
  JAMBO_REQUIRE(cache.kv_block_size > 0, "kv_block_size must be positive, got {}", cache.kv_block_size);
  JAMBO_REQUIRE(cache.num_kv_blocks >= 0, "num_kv_blocks must not be negative, got {}", cache.num_kv_blocks);
  JAMBO_REQUIRE(cuda_device_available(),
                "the CUDA backend needs a GPU, and none is visible (check nvidia-smi and "
                "CUDA_VISIBLE_DEVICES)");
  const DeviceScope scope(device_);
  JAMBO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  weights_ = std::make_unique<DeviceWeights>(model, mode, stream_);
  // Norms round their outputs to this type for the GEMMs they feed; linear() uses such a copy only for a weight
  // of the same type (a checkpoint stores its matrices in one type). Layer 0 has a mixer.
  const DeviceLayer& first = weights_->layers.front();
  narrow_dtype_ = config_.mixer_kinds.front() == model::MixerKind::Attention ? first.attention.q_proj.dtype
                                                                             : first.mamba.in_proj.dtype;

  require_state_dtype(cache.state_dtype);
  kv_block_stride_ =
      config_.num_attention_layers() * 2 * cache.kv_block_size * config_.num_key_value_heads * config_.head_dim;
  allocate_caches();
  JAMBO_CUDA_CHECK(cudaEventCreate(&layers_start_));
  JAMBO_CUDA_CHECK(cudaEventCreate(&layers_end_));
}

void CudaBackend::allocate_caches() {
  const int64_t state_bytes =
      slot_layout_.pool_bytes(cache_.num_state_slots + cache_.num_checkpoints, cache_.state_dtype);
  states_ = DeviceBuffer<std::byte>(state_bytes);
  JAMBO_CUDA_CHECK(cudaMemsetAsync(states_.data(), 0, size_t(state_bytes), stream_));
  const int64_t kv_elements = element_offset(cache_.num_kv_blocks, kv_block_stride_);
  kv_cache_ = DeviceBuffer<float>(kv_elements);
  JAMBO_CUDA_CHECK(cudaMemsetAsync(kv_cache_.data(), 0, size_t(element_offset(kv_elements, 4)), stream_));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  gemm_ = std::make_unique<Gemm>(stream_, /*pedantic=*/mode_ == WeightMode::F32, invariant_gemm_);
  if (decode_graphs_) graphs_ = std::make_unique<StepGraphs>(stream_);
}

void CudaBackend::sleep(SleepLevel level) {
  const DeviceScope scope(device_);
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The weights' copy first: if it fails (host memory), nothing has been let go of.
  if (level == SleepLevel::DropWeights) host_weights_ = {};
  if (weights_ != nullptr && level == SleepLevel::KeepWeights) weights_->save(host_weights_);
  release_device_memory();
}

// The recorded graphs go first: they hold the addresses of the buffers freed after them. The few buffers of a step's
// rows and results (uploader_, logits_outputs_) stay.
void CudaBackend::release_device_memory() {
  graphs_.reset();
  gemm_.reset();
  states_ = {};
  kv_cache_ = {};
  activations_ = {};
  mamba_scratch_ = {};
  attention_scratch_ = {};
  ffn_workspace_ = {};
  if (communicator_ != nullptr) communicator_->release_scratch();
  weights_.reset();
}

void CudaBackend::wake_up(const WakeTags& tags) {
  const DeviceScope scope(device_);
  if (tags.weights && weights_ == nullptr) {
    weights_ = host_weights_.num_bytes.empty() ? std::make_unique<DeviceWeights>(model_, mode_, stream_)
                                               : std::make_unique<DeviceWeights>(model_, mode_, stream_, host_weights_);
    host_weights_.num_bytes.clear();
  }
  if (tags.caches && gemm_ == nullptr) allocate_caches();
}

// The large buffers go here, on the backend's GPU, rather than as members after it.
CudaBackend::~CudaBackend() {
  const DeviceScope scope(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (layers_start_ != nullptr) cudaEventDestroy(layers_start_);
  if (layers_end_ != nullptr) cudaEventDestroy(layers_end_);
  release_device_memory();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

int64_t CudaBackend::slot_offset(int64_t slot) const {
  const int64_t offset = element_offset(slot, slot_layout_.slot_stride);
  return faults_.state_offset_modulus > 0 ? offset % faults_.state_offset_modulus : offset;
}

KvLayout CudaBackend::kv_layout(int64_t attention_layer) const {
  KvLayout layout;
  layout.block_size = cache_.kv_block_size;
  layout.num_kv_heads = config_.num_key_value_heads;
  layout.head_dim = config_.head_dim;
  layout.block_stride = kv_block_stride_;
  layout.layer_offset = element_offset(attention_layer, 2 * layout.half_stride());
  return layout;
}

void CudaBackend::copy_state(int64_t from_slot, int64_t to_slot) {
  require_state_slot(from_slot, cache_.num_state_slots + cache_.num_checkpoints, "copy_state");
  require_state_slot(to_slot, cache_.num_state_slots + cache_.num_checkpoints, "copy_state");
  if (from_slot == to_slot || slot_layout_.slot_stride == 0) return;
  const DeviceScope scope(device_);
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(slot_values(to_slot).data, slot_values(from_slot).data, size_t(slot_bytes()),
                                   cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_kv_block(int64_t from_block, int64_t to_block) {
  for (int64_t block : {from_block, to_block}) require_kv_block(block, cache_.num_kv_blocks);
  if (from_block == to_block || kv_block_stride_ == 0) return;
  const DeviceScope scope(device_);
  // One block of every attention layer is contiguous: [num_attention_layers, 2, kv_block_size, nkv, hd].
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(kv_cache_.data() + element_offset(to_block, kv_block_stride_),
                                   kv_cache_.data() + element_offset(from_block, kv_block_stride_),
                                   size_t(element_offset(kv_block_stride_, 4)), cudaMemcpyDeviceToDevice, stream_));
}

// NaN is all-ones bytes (0xffffffff is a quiet fp32 NaN, 0xffff a bf16 one), so one memset poisons the slot.
void CudaBackend::poison_state(int64_t slot) {
  require_state_slot(slot, cache_.num_state_slots + cache_.num_checkpoints, "poison_state");
  if (slot_layout_.slot_stride == 0) return;
  const DeviceScope scope(device_);
  JAMBO_CUDA_CHECK(cudaMemsetAsync(slot_values(slot).data, 0xff, size_t(slot_bytes()), stream_));
}

void CudaBackend::reserve_activations(int64_t num_tokens, int64_t num_vectors) {
  const int64_t hidden = config_.hidden_size;
  activations_.hidden.reserve(element_offset(num_tokens, hidden));
  activations_.normed.reserve(element_offset(num_tokens, hidden));
  activations_.update.reserve(element_offset(num_tokens, hidden));
  activations_.final_normed.reserve(element_offset(num_vectors, hidden));
  activations_.logits.reserve(element_offset(num_vectors, config_.vocab_size));
  activations_.routed_experts.reserve(config_.num_moe_layers() * num_tokens * config_.num_experts_per_tok);
  if (narrow_dtype_ == DType::F32) return;
  activations_.normed16.reserve(element_offset(num_tokens, hidden));
  activations_.final_normed16.reserve(element_offset(num_vectors, hidden));
}

Narrow16 CudaBackend::narrow_copy(DeviceBuffer<uint16_t>& buffer) const {
  return narrow_dtype_ == DType::F32 ? Narrow16{} : Narrow16{buffer.data(), narrow_dtype_};
}

// A GEMM whose weights are of the copy's 16-bit type reads only the copy (gemm.h); a GEMM of other weights rounds
// the fp32 input itself, and a MoE layer's router and expert gather read it as it is.
float* CudaBackend::normed_unless_copy_suffices(std::initializer_list<const DeviceMatrix*> readers) {
  const bool copy_suffices = narrow_dtype_ != DType::F32 && std::ranges::all_of(readers, [&](const DeviceMatrix* m) {
                               return m->dtype == narrow_dtype_;
                             });
  return copy_suffices ? nullptr : activations_.normed.data();
}

float* CudaBackend::normed_for_mixer(int64_t layer) {
  const DeviceLayer& w = weights_->layers[layer];
  if (config_.mixer_kinds[layer] == model::MixerKind::Attention)
    return normed_unless_copy_suffices({&w.attention.q_proj, &w.attention.k_proj, &w.attention.v_proj});
  return normed_unless_copy_suffices({&w.mamba.in_proj});
}

float* CudaBackend::normed_for_ffn(int64_t layer) {
  if (config_.ffn_kinds[layer] == model::FfnKind::Moe) return activations_.normed.data();
  return normed_unless_copy_suffices({&weights_->layers[layer].mlp.gate_up});
}

void CudaBackend::sum_over_ranks(float* values, int64_t count) {
  if (communicator_ != nullptr) communicator_->all_reduce_sum(values, count, stream_);
}

void CudaBackend::run_mamba(int64_t layer, const DeviceRows& rows) {
  const MambaStateLayout layout{config_.mamba_d_inner, config_.mamba_d_conv, config_.mamba_d_state,
                                element_offset(index_in_kind_[layer], slot_layout_.layer_stride)};
  mamba_mixer(*gemm_, weights_->layers[layer].mamba, config_, layout, rows, activations_.normed.data(), state_pool(),
              activations_.update.data(), mamba_scratch_, stream_, narrow_copy(activations_.normed16),
              communicator_.get());
}

void CudaBackend::run_attention(int64_t layer, const DeviceRows& rows) {
  attention_mixer(*gemm_, weights_->layers[layer].attention, config_, kv_layout(index_in_kind_[layer]), rows,
                  activations_.normed.data(), kv_cache_.data(), activations_.update.data(), attention_scratch_, stream_,
                  narrow_copy(activations_.normed16));
}

void CudaBackend::forward(std::span<const BatchRow> rows, StepOutput& output) {
  validate_rows(rows, config_,
                {cache_.num_state_slots, cache_.num_kv_blocks, cache_.kv_block_size, cache_.num_checkpoints});
  const DeviceScope scope(device_);
  std::vector<int64_t> state_offsets, checkpoint_offsets;
  std::vector<int32_t> reads_state;
  for (const BatchRow& row : rows) {
    state_offsets.push_back(slot_offset(row.slot));
    reads_state.push_back(row.has_initial_state || (faults_.decode_before_prefill && row.tokens.size() == 1));
    for (const StateCheckpoint& checkpoint : row.checkpoints)
      checkpoint_offsets.push_back(slot_offset(checkpoint.slot));
  }
  const DeviceRows device_rows = uploader_.upload(rows, state_offsets, reads_state, checkpoint_offsets, stream_);
  reserve_activations(device_rows.num_tokens, device_rows.num_vectors);
  // A replayed graph does not run paged_attention's own reservation, and a step's splits grow with its context.
  if (config_.num_attention_layers() > 0)
    attention_scratch_.partial.reserve(attention_partial_size(device_rows, kv_layout(0), config_.num_attention_heads));
  JAMBO_CUDA_CHECK(cudaEventRecord(layers_start_, stream_));
  if (runs_as_graph(device_rows))
    graphs_->run(device_rows.num_rows, [&] { enqueue_layers(device_rows); });
  else
    enqueue_layers(device_rows);
  JAMBO_CUDA_CHECK(cudaEventRecord(layers_end_, stream_));
  logits_outputs_.compute(rows, activations_.logits.data(), config_.vocab_size, stream_, output);  // synchronizes
  save_checkpoints_at_row_ends(rows);  // after the step's latency; the next step's work follows them on the stream
  if (any_row_wants_routing(rows)) add_routing(rows, device_rows.num_tokens, output);
  float layers_ms = 0.0f;
  JAMBO_CUDA_CHECK(cudaEventElapsedTime(&layers_ms, layers_start_, layers_end_));
  layers_gpu_seconds_ += double(layers_ms) * 1e-3;
}

// A checkpoint after a row's last token is the row's slot once the step is done: a copy ordered after the layers
// (and outside the decode graphs, which stay as they are). Those inside a row the kernels write (DeviceRows).
void CudaBackend::save_checkpoints_at_row_ends(std::span<const BatchRow> rows) {
  for (const BatchRow& row : rows)
    for (const StateCheckpoint& checkpoint : row.checkpoints)
      if (!is_inside_row(row, checkpoint)) copy_state(row.slot, checkpoint.slot);
}

void CudaBackend::add_routing(std::span<const BatchRow> rows, int64_t num_tokens, StepOutput& output) const {
  const int64_t num_moe_layers = config_.num_moe_layers(), k = config_.num_experts_per_tok;
  std::vector<int32_t> routed(size_t(num_moe_layers * num_tokens * k));
  JAMBO_CUDA_CHECK(cudaMemcpy(routed.data(), activations_.routed_experts.data(), routed.size() * sizeof(int32_t),
                              cudaMemcpyDeviceToHost));
  add_routed_experts(rows, {routed, num_moe_layers, num_tokens, k}, output);
}

// Decode steps (every row one token): for a given number of rows they launch the same kernels on the same
// buffers, the uploaded row data aside, unless a MoE layer reads its expert counts back to the host.
bool CudaBackend::runs_as_graph(const DeviceRows& rows) const {
  if (graphs_ == nullptr || rows.num_tokens != rows.num_rows) return false;
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
    if (config_.ffn_kinds[layer] == model::FfnKind::Moe &&
        !experts_run_grouped(weights_->layers[layer].moe, rows.num_tokens, expert_gemms_of(*gemm_)))
      return false;
  return true;
}

void CudaBackend::enqueue_layers(const DeviceRows& device_rows) {
  const int64_t num_tokens = device_rows.num_tokens, num_vectors = device_rows.num_vectors;
  const int64_t hidden = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  Activations& a = activations_;
  const Narrow16 normed16 = narrow_copy(a.normed16);
  gather_rows(weights_->embed_tokens, device_rows.tokens, device_rows.num_tokens, hidden, a.hidden.data(), stream_);
  rms_norm(a.hidden.data(), hidden, num_tokens, hidden, weights_->layers[0].input_norm, eps, normed_for_mixer(0),
           hidden, stream_, normed16);
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const DeviceLayer& w = weights_->layers[layer];
    if (config_.mixer_kinds[layer] == model::MixerKind::Attention)
      run_attention(layer, device_rows);
    else
      run_mamba(layer, device_rows);
    sum_over_ranks(a.update.data(), element_offset(num_tokens, hidden));
    add_rms_norm(a.hidden.data(), a.update.data(), num_tokens, hidden, w.pre_ff_norm, eps, normed_for_ffn(layer),
                 stream_, normed16);
    if (config_.ffn_kinds[layer] == model::FfnKind::Moe) {
      const int64_t k = config_.num_experts_per_tok;
      sparse_moe(*gemm_, w.moe, k, a.normed.data(), num_tokens, a.update.data(), ffn_workspace_, stream_, normed16,
                 expert_gemms_of(*gemm_));
      // Every step, graphs and all, for the rows that ask (a few bytes a token).
      JAMBO_CUDA_CHECK(cudaMemcpyAsync(a.routed_experts.data() + element_offset(moe_index_[layer], num_tokens * k),
                                       ffn_workspace_.expert_of.data(), size_t(element_offset(num_tokens * k, 4)),
                                       cudaMemcpyDeviceToDevice, stream_));
    } else
      dense_mlp(*gemm_, w.mlp, a.normed.data(), num_tokens, a.update.data(), ffn_workspace_, stream_, normed16);
    sum_over_ranks(a.update.data(), element_offset(num_tokens, hidden));
    const bool last = layer + 1 == config_.num_hidden_layers;
    add_rms_norm(a.hidden.data(), a.update.data(), num_tokens, hidden,
                 last ? nullptr : weights_->layers[layer + 1].input_norm, eps,
                 last ? nullptr : normed_for_mixer(layer + 1), stream_, normed16);
  }
  const Narrow16 final16 = narrow_copy(a.final_normed16);
  gather_rms_norm(device_rows, a.hidden.data(), hidden, weights_->final_norm, eps, a.final_normed.data(), stream_,
                  final16);
  linear(*gemm_, a.final_normed.data(), num_vectors, weights_->lm_head, a.logits.data(), final16);
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void cuda_profiler_capture(bool on) { JAMBO_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }

int64_t cuda_available_memory_bytes() {
  JAMBO_REQUIRE(cuda_device_available(), "a memory budget for the CUDA backend needs a GPU, and none is visible");
  size_t free_bytes = 0, total_bytes = 0;
  JAMBO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return int64_t(free_bytes);
}

std::unique_ptr<Backend> make_cuda_backend(const model::Model& model, const CacheConfig& cache,
                                           const std::string& weights, bool decode_graphs, bool invariant_gemm,
                                           std::unique_ptr<DeviceCommunicator> communicator) {
  const WeightMode mode = parse_weight_mode(weights);
  return std::make_unique<CudaBackend>(model, cache, mode, decode_graphs, invariant_gemm, std::move(communicator));
}

std::unique_ptr<Backend> make_tensor_parallel_cuda_backend(const model::Model& model, const CacheConfig& cache,
                                                           std::vector<std::unique_ptr<DeviceCommunicator>> group,
                                                           const std::string& weights, bool decode_graphs,
                                                           bool invariant_gemm) {
  // No decode graphs yet: each rank decides on its own whether a step replays a graph (its buffers may have moved),
  // and NCCL needs the two sides of every send and receive captured alike.
  const bool graphs = decode_graphs && group.size() == 1;
  DeviceCommunicator* any_rank = group.front().get();  // an abort through any rank ends the group
  const int64_t size = int64_t(group.size());
  const auto make_rank = [&](int64_t rank, const model::Model& shard) {
    return make_cuda_backend(shard, cache, weights, graphs, invariant_gemm, std::move(group[size_t(rank)]));
  };
  return make_tensor_parallel_backend(model, cache, size, make_rank, [any_rank] { any_rank->abort(); });
}

int64_t cuda_graph_replays(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  return cuda_backend == nullptr ? 0 : cuda_backend->graph_replays();
}

double cuda_layers_gpu_seconds(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  return cuda_backend == nullptr ? 0.0 : cuda_backend->layers_gpu_seconds();
}

int64_t cuda_weight_bytes(const model::Model& model, const std::string& weights) {
  return DeviceWeights::bytes_needed(model, parse_weight_mode(weights));
}

double cuda_copy_gb_per_s(int64_t bytes) {
  JAMBO_REQUIRE(cuda_device_available(), "the copy ceiling needs a GPU, and none is visible");
  DeviceBuffer<char> from(bytes), to(bytes);
  JAMBO_CUDA_CHECK(cudaMemset(from.data(), 1, size_t(bytes)));
  cudaEvent_t start = nullptr, stop = nullptr;
  JAMBO_CUDA_CHECK(cudaEventCreate(&start));
  JAMBO_CUDA_CHECK(cudaEventCreate(&stop));
  float best_ms = 1e30f;
  for (int repeat = 0; repeat < 6; ++repeat) {  // the first is a warm-up like the others; the best counts
    JAMBO_CUDA_CHECK(cudaEventRecord(start));
    JAMBO_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), size_t(bytes), cudaMemcpyDeviceToDevice));
    JAMBO_CUDA_CHECK(cudaEventRecord(stop));
    JAMBO_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    JAMBO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * double(bytes) / (double(best_ms) * 1e-3) / 1e9;
}

}  // namespace jambo::backend::cuda
