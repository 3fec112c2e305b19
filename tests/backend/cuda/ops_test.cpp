// Each kernel family of the CUDA backend against its CPU twin on the same inputs: RMSNorm, the GEMM, the Mamba
// mixer (conv1d and selective scan, rows from zero state and continuing rows, one-token rows, outputs and the
// states left in the slots), the attention mixer (paged KV over two steps, GQA, MQA and plain multi-head), the
// dense MLP and the MoE (top-1 and top-2; grouped expert GEMMs and per-expert cuBLAS GEMMs), and the GEMM of
// 16-bit weights (our GEMV for few rows, cuBLAS beyond) against the product of rounded inputs.
#include "support/random_tensors.h"
#include "support/test_models.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/ffn.h"
#include "backend/cpu/mamba.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/state_memory.h"
#include "backend/cpu/vector_ops.h"
#include "backend/cuda/convert.h"
#include "backend/cuda/embedding_norm.h"
#include "backend/cuda/ffn.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/mamba.h"
#include "backend/cuda/mixers.h"
#include "backend/cuda/skinny_gemm.h"
#include "backend/cuda/step_rows.h"
#include "cuda_test_util.h"

#include <cstring>
#include <numeric>

namespace jambo::testing {
namespace {

using backend::cpu::Matrix;
using backend::cuda::DeviceBuffer;

constexpr double kRelativeTolerance = 1e-5;

// |actual - expected| <= tolerance * max |expected| everywhere.
void expect_close(const std::vector<float>& actual, const float* expected, const std::string& what,
                  double tolerance = kRelativeTolerance) {
  double magnitude = 0.0, worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) magnitude = std::max(magnitude, std::fabs(double(expected[i])));
  size_t worst_index = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double difference = std::fabs(double(actual[i]) - double(expected[i]));
    if (!(difference <= worst)) worst_index = i;
    worst = std::isnan(difference) ? INFINITY : std::max(worst, difference);
  }
  EXPECT_GT(magnitude, 0.0) << what;
  EXPECT_LE(worst, tolerance * magnitude)
      << what << ": worst at " << worst_index << ", " << actual[worst_index] << " against " << expected[worst_index]
      << " (max magnitude " << magnitude << ")";
}

// One step's rows as the backend builds them: tokens are placeholders (the mixers do not read them).
struct StepSpec {
  std::vector<int64_t> num_tokens, start_positions, slots;
  std::vector<int32_t> reads_state;
  std::vector<std::vector<backend::StateCheckpoint>> checkpoints = {};  // per row, where given
};

class OpsTest : public GpuParamTest<TestModelSpec> {
 protected:
  void SetUp() override {
    GpuParamTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    gemm_ = std::make_unique<backend::cuda::Gemm>(stream_, /*pedantic=*/true);
    weights_ = std::make_unique<backend::cuda::DeviceWeights>(model_, backend::cuda::WeightMode::F32, stream_);
  }
  void TearDown() override {
    weights_.reset();
    gemm_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void check_mamba_mixer(DType state_dtype);
  int64_t first_layer(model::MixerKind kind) const {
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l)
      if (config_.mixer_kinds[l] == kind) return l;
    return -1;
  }
  int64_t first_ffn(model::FfnKind kind) const {
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l)
      if (config_.ffn_kinds[l] == kind) return l;
    return -1;
  }

  // sparse_moe over num_tokens random rows, once for each way of running the experts, the outputs in that order.
  std::vector<std::vector<float>> moe_outputs(backend::cuda::Gemm& gemm, const backend::cuda::DeviceMoe& moe,
                                              int64_t num_tokens,
                                              std::initializer_list<backend::cuda::ExpertGemms> ways) {
    const backend::cpu::Matrix x = store_.matrix(num_tokens, config_.hidden_size, 1.0f);
    backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), num_tokens * config_.hidden_size);
    std::vector<std::vector<float>> outputs;
    for (const backend::cuda::ExpertGemms gemms : ways) {
      backend::cuda::DeviceBuffer<float> out(num_tokens * config_.hidden_size);
      backend::cuda::FfnWorkspace workspace;
      backend::cuda::sparse_moe(gemm, moe, config_.num_experts_per_tok, device_x.data(), num_tokens, out.data(),
                                workspace, stream_, {}, gemms);
      outputs.push_back(download(out.data(), num_tokens * config_.hidden_size));
    }
    return outputs;
  }

  backend::cuda::DeviceRows upload_rows(const StepSpec& spec, int64_t slot_stride) {
    const int64_t total = std::accumulate(spec.num_tokens.begin(), spec.num_tokens.end(), int64_t(0));
    tokens_.assign(size_t(total), 0);
    block_tables_.clear();
    rows_.clear();
    std::vector<int64_t> offsets, checkpoint_offsets;
    for (size_t r = 0; r < spec.num_tokens.size(); ++r) {
      std::vector<int32_t> table(kBlocksPerRow);
      std::iota(table.begin(), table.end(), int32_t(r * kBlocksPerRow));
      block_tables_.push_back(table);
      offsets.push_back(spec.slots[r] * slot_stride);
    }
    int64_t first = 0;
    for (size_t r = 0; r < spec.num_tokens.size(); ++r) {
      backend::BatchRow row;
      row.tokens = std::span<const int32_t>(tokens_).subspan(size_t(first), size_t(spec.num_tokens[r]));
      row.start_position = spec.start_positions[r];
      row.slot = spec.slots[r];
      row.block_table = block_tables_[r];
      if (r < spec.checkpoints.size()) row.checkpoints = spec.checkpoints[r];
      rows_.push_back(row);
      first += spec.num_tokens[r];
      for (const backend::StateCheckpoint& checkpoint : row.checkpoints)
        checkpoint_offsets.push_back(checkpoint.slot * slot_stride);
    }
    return uploader_.upload(rows_, offsets, spec.reads_state, checkpoint_offsets, stream_);
  }

  static constexpr int64_t kBlocksPerRow = 8;
  static constexpr int64_t kBlockSize = 4;
  model::Model model_ = make_random_model(GetParam().config, GetParam().dtype, 17);
  const model::JambaConfig& config_ = model_.config;
  TensorStore store_{23};
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<backend::cuda::Gemm> gemm_;
  std::unique_ptr<backend::cuda::DeviceWeights> weights_;
  backend::cuda::StepRowsUploader uploader_;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<int32_t>> block_tables_;
  std::vector<backend::BatchRow> rows_;
};

TEST_P(OpsTest, RmsNormAndGemm) {
  const backend::cpu::Matrix x = store_.matrix(13, config_.hidden_size, 1.0f);
  backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), 13 * config_.hidden_size);
  const TensorView& weight = model_.weights.layers[0].input_norm;
  backend::cpu::Matrix expected;
  backend::cpu::rms_norm_rows(x, weight, float(config_.rms_norm_eps), expected);
  backend::cuda::DeviceBuffer<float> out(13 * config_.hidden_size);
  backend::cuda::rms_norm(device_x.data(), config_.hidden_size, 13, config_.hidden_size, weights_->layers[0].input_norm,
                          float(config_.rms_norm_eps), out.data(), config_.hidden_size, stream_);
  expect_close(download(out.data(), 13 * config_.hidden_size), expected.data(), "rms_norm");

  backend::cpu::Matrix product;
  backend::cpu::matmul(x, model_.weights.lm_head, product);
  backend::cuda::DeviceBuffer<float> logits(13 * config_.vocab_size);
  backend::cuda::linear(*gemm_, device_x.data(), 13, weights_->lm_head, logits.data());
  expect_close(download(logits.data(), 13 * config_.vocab_size), product.data(), "linear");
}

// The state pool's values as floats (a bf16 pool widened exactly).
std::vector<float> widen_state(backend::StateValues values, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[size_t(i)] = values.get(i);
  return out;
}

// The Mamba mixer on the GPU against its CPU twin, with the state pool stored as state_dtype on both. A bf16 pool
// rounds every stored value alike on both sides, but fp32 sums in another order can land on either side of a
// rounding boundary: a state entry may then differ by one bf16 step (2^-8 of its magnitude), and so may the outputs
// that read it one step later. Hence 1/256 of the largest magnitude for bf16, 1e-4 for fp32.
void OpsTest::check_mamba_mixer(DType state_dtype) {
  const int64_t layer = first_layer(model::MixerKind::Mamba);
  const double tolerance = state_dtype == DType::F32 ? 1e-4 : 1.0 / 256;
  const int64_t num_slots = 10;  // 4 rows' slots, then checkpoints
  backend::cpu::StatePool cpu_pool(config_, num_slots, state_dtype);
  const int64_t slot_stride = cpu_pool.elements_per_slot();
  const int64_t pool_size = num_slots * slot_stride;
  const backend::StateValues cpu_values = cpu_pool.conv_tail(0, 0);
  {  // an earlier state in every slot, for the rows that continue one
    const backend::cpu::Matrix noise = store_.matrix(1, pool_size, 0.5f);
    for (int64_t i = 0; i < pool_size; ++i) cpu_values.set(i, noise.data()[i]);
  }
  const int64_t pool_bytes = pool_size * dtype_size(state_dtype);
  backend::cuda::DeviceBuffer<std::byte> gpu_pool(pool_bytes);
  ASSERT_EQ(cudaMemcpy(gpu_pool.data(), cpu_values.data, size_t(pool_bytes), cudaMemcpyHostToDevice), cudaSuccess);
  const int64_t layer_stride = config_.mamba_d_inner * (config_.mamba_d_conv - 1 + config_.mamba_d_state);
  const backend::cuda::MambaStateLayout layout{config_.mamba_d_inner, config_.mamba_d_conv, config_.mamba_d_state, 0};
  backend::cuda::MambaScratch scratch;

  // Rows from zero state (one of them a single token), continuing rows, one-token decodes; then two decode
  // steps (every row one token: the state-update kernel), the last with a one-token row from zero state
  // in a slot that holds a state (law 1: it must not be read); then rows of several scan chunks (64 tokens
  // each): 150 tokens continuing a state, exactly one chunk from zero state, one token past a chunk, and a decode,
  // saving checkpoints inside the rows (slots 4 to 9: inside the old conv tail of a row that reads its state, inside a
  // stage of the scan, at a stage's end, past a chunk).
  static_assert(backend::cuda::kScanChunkTokens == 64, "the long rows below straddle chunk boundaries of 64 tokens");
  const std::vector<StepSpec> steps = {
      {{5, 1, 9}, {0, 0, 0}, {0, 2, 1}, {0, 0, 0}},
      {{1, 3, 1, 2}, {5, 1, 9, 0}, {0, 2, 1, 3}, {1, 1, 1, 0}},
      {{1, 1, 1, 1}, {6, 4, 10, 2}, {0, 2, 1, 3}, {1, 1, 1, 1}},
      {{1, 1}, {7, 0}, {0, 3}, {1, 0}},
      {{150, 1, 64, 65},
       {8, 5, 0, 1},
       {0, 2, 1, 3},
       {1, 1, 0, 1},
       {{{2, 4}, {5, 5}, {32, 6}, {100, 7}}, {}, {{3, 8}}, {{64, 9}}}},
      {{1, 130, 1}, {158, 6, 64}, {0, 2, 1}, {1, 0, 1}}};
  for (size_t s = 0; s < steps.size(); ++s) {
    const StepSpec& spec = steps[s];
    const int64_t total = std::accumulate(spec.num_tokens.begin(), spec.num_tokens.end(), int64_t(0));
    const backend::cpu::Matrix x = store_.matrix(total, config_.hidden_size, 1.0f);
    std::vector<backend::cpu::MambaRow> cpu_rows;
    std::vector<std::vector<backend::cpu::MambaCheckpoint>> cpu_checkpoints(spec.num_tokens.size());
    int64_t first = 0;
    for (size_t r = 0; r < spec.num_tokens.size(); ++r) {
      if (r < spec.checkpoints.size())
        for (const backend::StateCheckpoint& saved : spec.checkpoints[r])
          cpu_checkpoints[r].push_back(
              {saved.num_tokens, cpu_pool.conv_tail(saved.slot, 0), cpu_pool.ssm_state(saved.slot, 0)});
      cpu_rows.push_back({first, spec.num_tokens[r], spec.reads_state[r] != 0, cpu_pool.conv_tail(spec.slots[r], 0),
                          cpu_pool.ssm_state(spec.slots[r], 0), cpu_checkpoints[r]});
      first += spec.num_tokens[r];
    }
    backend::cpu::Matrix expected;
    backend::cpu::mamba_mixer(model_.weights.layers[layer].mamba, config_, x, cpu_rows, expected);

    const backend::cuda::DeviceRows rows = upload_rows(spec, slot_stride);
    backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), total * config_.hidden_size);
    backend::cuda::DeviceBuffer<float> out(total * config_.hidden_size);
    backend::cuda::mamba_mixer(*gemm_, weights_->layers[layer].mamba, config_, layout, rows, device_x.data(),
                               backend::StateValues{gpu_pool.data(), state_dtype}, out.data(), scratch, stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::string where = std::string(dtype_name(state_dtype)) + " state, step " + std::to_string(s);
    expect_close(download(out.data(), total * config_.hidden_size), expected.data(), "Mamba output, " + where,
                 tolerance);
    // The first Mamba layer's state of every slot: written rows updated alike, others untouched.
    std::vector<std::byte> gpu_bytes(static_cast<size_t>(pool_bytes));
    ASSERT_EQ(cudaMemcpy(gpu_bytes.data(), gpu_pool.data(), size_t(pool_bytes), cudaMemcpyDeviceToHost), cudaSuccess);
    const backend::StateValues gpu_values{gpu_bytes.data(), state_dtype};
    for (int64_t slot = 0; slot < num_slots; ++slot) {
      const std::vector<float> expected_state = widen_state(cpu_values + slot * slot_stride, layer_stride);
      expect_close(widen_state(gpu_values + slot * slot_stride, layer_stride), expected_state.data(),
                   "state of slot " + std::to_string(slot) + ", " + where, tolerance);
    }
  }
}

TEST_P(OpsTest, MambaMixerMatchesCpu) {
  if (first_layer(model::MixerKind::Mamba) < 0) GTEST_SKIP() << "no Mamba layer";
  check_mamba_mixer(DType::F32);
  check_mamba_mixer(DType::BF16);
}

TEST_P(OpsTest, AttentionMixerMatchesCpu) {
  const int64_t layer = first_layer(model::MixerKind::Attention);
  if (layer < 0) GTEST_SKIP() << "no attention layer";
  const backend::CacheConfig cache{4, 4 * kBlocksPerRow, kBlockSize};
  backend::cpu::KvCache cpu_cache(config_, cache);
  backend::cuda::KvLayout layout;
  layout.block_size = kBlockSize;
  layout.num_kv_heads = config_.num_key_value_heads;
  layout.head_dim = config_.head_dim;
  layout.block_stride = config_.num_attention_layers() * 2 * layout.half_stride();
  layout.layer_offset = 0;
  const int64_t pool_size = cache.num_kv_blocks * layout.block_stride;
  backend::cuda::DeviceBuffer<float> gpu_pool(pool_size);
  ASSERT_EQ(cudaMemset(gpu_pool.data(), 0, size_t(pool_size) * 4), cudaSuccess);
  backend::cuda::AttentionScratch scratch;

  const std::vector<StepSpec> steps = {{{6, 3, 1}, {0, 0, 0}, {0, 1, 2}, {0, 0, 0}},
                                       {{1, 5, 1, 9}, {6, 3, 1, 0}, {0, 1, 2, 3}, {1, 1, 1, 0}}};
  for (size_t s = 0; s < steps.size(); ++s) {
    const StepSpec& spec = steps[s];
    const int64_t total = std::accumulate(spec.num_tokens.begin(), spec.num_tokens.end(), int64_t(0));
    const backend::cpu::Matrix x = store_.matrix(total, config_.hidden_size, 1.0f);
    const backend::cuda::DeviceRows rows = upload_rows(spec, 0);
    std::vector<backend::cpu::AttentionRow> cpu_rows;
    int64_t first = 0;
    for (size_t r = 0; r < spec.num_tokens.size(); ++r) {
      cpu_rows.push_back({first, spec.num_tokens[r], spec.start_positions[r], block_tables_[r]});
      first += spec.num_tokens[r];
    }
    backend::cpu::Matrix expected;
    backend::cpu::attention_mixer(model_.weights.layers[layer].attention, config_, cpu_cache, 0, x, cpu_rows, expected);
    backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), total * config_.hidden_size);
    backend::cuda::DeviceBuffer<float> out(total * config_.hidden_size);
    backend::cuda::attention_mixer(*gemm_, weights_->layers[layer].attention, config_, layout, rows, device_x.data(),
                                   gpu_pool.data(), out.data(), scratch, stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    expect_close(download(out.data(), total * config_.hidden_size), expected.data(),
                 "attention output, step " + std::to_string(s), 1e-4);
  }
}

// Steps of 1 and 29 tokens run the experts as grouped GEMMs (29 tokens: several passes over some experts' weights),
// 300 tokens (past kMaxGroupedTokens) per expert.
TEST_P(OpsTest, FeedForwardMatchesCpu) {
  for (const int64_t num_tokens : {int64_t(1), int64_t(29), backend::cuda::kMaxGroupedTokens + 44}) {
    const std::string tokens = ", " + std::to_string(num_tokens) + " tokens";
    const backend::cpu::Matrix x = store_.matrix(num_tokens, config_.hidden_size, 1.0f);
    backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), num_tokens * config_.hidden_size);
    backend::cuda::DeviceBuffer<float> out(num_tokens * config_.hidden_size);
    backend::cuda::FfnWorkspace workspace;
    if (const int64_t layer = first_ffn(model::FfnKind::Dense); layer >= 0) {
      backend::cpu::Matrix expected;
      backend::cpu::dense_mlp(model_.weights.layers[layer].mlp, x, expected);
      backend::cuda::dense_mlp(*gemm_, weights_->layers[layer].mlp, device_x.data(), num_tokens, out.data(), workspace,
                               stream_);
      expect_close(download(out.data(), num_tokens * config_.hidden_size), expected.data(), "dense MLP" + tokens, 1e-4);
    }
    if (const int64_t layer = first_ffn(model::FfnKind::Moe); layer >= 0) {
      backend::cpu::Matrix expected;
      backend::cpu::sparse_moe(model_.weights.layers[layer].moe, config_.num_experts_per_tok, x, expected);
      backend::cuda::sparse_moe(*gemm_, weights_->layers[layer].moe, config_.num_experts_per_tok, device_x.data(),
                                num_tokens, out.data(), workspace, stream_);
      expect_close(download(out.data(), num_tokens * config_.hidden_size), expected.data(),
                   "MoE top-" + std::to_string(config_.num_experts_per_tok) + tokens, 1e-4);
    }
  }
}

// In the bf16 mode both ways round the expert inputs to the weights' 16-bit type and accumulate in fp32: the
// grouped GEMMs equal the per-expert cuBLAS GEMMs to accumulation order.
TEST_P(OpsTest, GroupedExpertGemmsEqualPerExpertGemmsInBf16Mode) {
  const int64_t layer = first_ffn(model::FfnKind::Moe);
  if (layer < 0) GTEST_SKIP() << "no MoE layer";
  const backend::cuda::DeviceWeights narrow_weights(model_, backend::cuda::WeightMode::Bf16, stream_);
  backend::cuda::Gemm narrow_gemm(stream_, /*pedantic=*/false);
  ASSERT_TRUE(
      backend::cuda::experts_run_grouped(narrow_weights.layers[layer].moe, 1, backend::cuda::ExpertGemms::Grouped));
  for (const int64_t num_tokens : {int64_t(1), int64_t(7), int64_t(200)}) {
    const std::vector<std::vector<float>> outputs =
        moe_outputs(narrow_gemm, narrow_weights.layers[layer].moe, num_tokens,
                    {backend::cuda::ExpertGemms::PerExpert, backend::cuda::ExpertGemms::Grouped});
    expect_close(outputs[1], outputs[0].data(), "grouped against per-expert, " + std::to_string(num_tokens) + " tokens",
                 1e-5);
  }
}

// On an invariant Gemm, the experts grouped on the invariant GEMM (ExpertGemms::Invariant, what the engine runs) equal
// each expert's GEMMs alone bit for bit, in the f32 and bf16 modes, for a token, a few and more than the largest tile.
TEST_P(OpsTest, InvariantGroupedExpertGemmsEqualPerExpertGemmsBitForBit) {
  const int64_t layer = first_ffn(model::FfnKind::Moe);
  if (layer < 0) GTEST_SKIP() << "no MoE layer";
  backend::cuda::Gemm invariant_gemm(stream_, /*pedantic=*/false, /*invariant=*/true);
  ASSERT_EQ(backend::cuda::expert_gemms_of(invariant_gemm), backend::cuda::ExpertGemms::Invariant);
  for (const backend::cuda::WeightMode mode : {backend::cuda::WeightMode::F32, backend::cuda::WeightMode::Bf16}) {
    const backend::cuda::DeviceWeights weights(model_, mode, stream_);
    for (const int64_t num_tokens : {int64_t(1), int64_t(7), int64_t(200)}) {
      SCOPED_TRACE(std::string(mode == backend::cuda::WeightMode::F32 ? "f32" : "bf16") + ", " +
                   std::to_string(num_tokens) + " tokens");
      const std::vector<std::vector<float>> outputs =
          moe_outputs(invariant_gemm, weights.layers[layer].moe, num_tokens,
                      {backend::cuda::ExpertGemms::PerExpert, backend::cuda::ExpertGemms::Invariant});
      EXPECT_TRUE(bitwise_equal(outputs[1].data(), outputs[0].data(), num_tokens * config_.hidden_size));
    }
  }
}

// A decode step's conv run by the in_proj GEMM (DecodeConv) equals in_proj and then the conv kernel bit for bit: the
// same GEMM sums feed the same conv_output. Outputs, their 16-bit copies, z and the slots' new tails and states, for
// one row and for two (one without state, law 1), with 16-bit weights; the model's own width takes four warps per
// in_proj output, a hidden size of 512 one warp.
TEST_P(OpsTest, DecodeConvInTheGemmEqualsTheConvKernel) {
  const int64_t layer = first_layer(model::MixerKind::Mamba);
  if (layer < 0) GTEST_SKIP() << "no Mamba layer";
  for (const int64_t hidden_size : {config_.hidden_size, int64_t(512)}) {
    SCOPED_TRACE("hidden size " + std::to_string(hidden_size));
    model::JambaConfig config = config_;
    config.hidden_size = hidden_size;
    config.mamba_d_inner = config.mamba_expand * hidden_size;
    config.mamba_dt_rank = (hidden_size + 15) / 16;
    const model::Model model = make_random_model(config, DType::BF16, 31);
    const backend::cuda::DeviceWeights weights(model, backend::cuda::WeightMode::Bf16, stream_);
    const backend::cuda::DeviceMamba& mamba = weights.layers[layer].mamba;
    backend::cuda::Gemm gemm(stream_, /*pedantic=*/false);
    const int64_t num_slots = 2, inner = config.mamba_d_inner;
    const int64_t slot_stride = backend::cpu::StatePool(config, num_slots, DType::F32).elements_per_slot();
    const backend::cpu::Matrix earlier_state = store_.matrix(1, num_slots * slot_stride, 0.5f);
    const backend::cuda::MambaStateLayout layout{inner, config.mamba_d_conv, config.mamba_d_state, 0};
    for (const StepSpec& spec : {StepSpec{{1}, {3}, {1}, {1}}, StepSpec{{1, 1}, {5, 2}, {0, 1}, {0, 1}}}) {
      const int64_t rows_count = int64_t(spec.num_tokens.size());
      const backend::cpu::Matrix x = store_.matrix(rows_count, hidden_size, 1.0f);
      backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), rows_count * hidden_size);
      const backend::cuda::DeviceRows rows = upload_rows(spec, slot_stride);
      struct Way {
        std::vector<float> slots, outputs, z;  // the pool after the step, the conv outputs, in_proj's z columns
        std::vector<uint16_t> copies;          // the conv outputs' 16-bit copies
      };
      std::vector<Way> ways;  // unfused, then fused
      for (const bool fused : {false, true}) {
        backend::cuda::DeviceBuffer<float> pool = upload(earlier_state.data(), num_slots * slot_stride);
        backend::cuda::DeviceBuffer<float> projected(rows_count * 2 * inner), activated(rows_count * inner);
        backend::cuda::DeviceBuffer<uint16_t> activated16(rows_count * inner);
        // NaN (all bits set) wherever a way leaves an output unwritten, rather than an earlier buffer's values.
        ASSERT_EQ(cudaMemset(projected.data(), 0xff, size_t(rows_count * 2 * inner) * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(activated.data(), 0xff, size_t(rows_count * inner) * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(activated16.data(), 0xff, size_t(rows_count * inner) * 2), cudaSuccess);
        const backend::cuda::Narrow16 copy{activated16.data(), DType::BF16};
        const backend::StateValues state{pool.data(), DType::F32};
        const backend::cuda::DecodeConv conv{rows, layout, mamba.conv_weight, mamba.conv_bias, state, activated.data(),
                                             copy};
        ASSERT_TRUE(backend::cuda::linear_conv_fuses(gemm, device_x.data(), rows_count, mamba.in_proj, {}, conv));
        if (fused) {
          backend::cuda::linear_conv(gemm, device_x.data(), rows_count, mamba.in_proj, {}, projected.data(), conv);
        } else {
          backend::cuda::linear(gemm, device_x.data(), rows_count, mamba.in_proj, projected.data());
          backend::cuda::causal_conv1d(rows, layout, projected.data(), mamba.conv_weight, mamba.conv_bias, state,
                                       activated.data(), copy, stream_);
        }
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        Way& way = ways.emplace_back();
        const std::vector<float> all = download(projected.data(), rows_count * 2 * inner);
        for (int64_t r = 0; r < rows_count; ++r)
          way.z.insert(way.z.end(), all.begin() + (2 * r + 1) * inner, all.begin() + (2 * r + 2) * inner);
        way.slots = download(pool.data(), num_slots * slot_stride);
        way.outputs = download(activated.data(), rows_count * inner);
        way.copies.resize(size_t(rows_count * inner));
        ASSERT_EQ(cudaMemcpy(way.copies.data(), activated16.data(), way.copies.size() * 2, cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
      const std::string where = std::to_string(rows_count) + " rows";
      EXPECT_EQ(ways[1].slots, ways[0].slots) << "slots (tails and states), " << where;
      EXPECT_EQ(ways[1].outputs, ways[0].outputs) << "conv outputs, " << where;
      EXPECT_EQ(ways[1].z, ways[0].z) << "z, " << where;
      EXPECT_EQ(ways[1].copies, ways[0].copies) << "16-bit conv outputs, " << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TestModels, OpsTest, ::testing::ValuesIn(test_model_specs()), spec_name);

class GemmTest : public StreamTest {};

// 16-bit weights: linear() (skinny_gemm up to kMaxSkinnyGemmRows rows, cuBLAS beyond and for K not a multiple of 8;
// skinny_gemm with four warps per output below 1056 outputs, one warp from there) equals the product of x rounded to
// the weight's type with the weights, summed in double, to fp32 accumulation order.
TEST_F(GemmTest, SixteenBitWeightsMultiplyInputsRoundedToTheirType) {
  backend::cuda::Gemm gemm(stream_, /*pedantic=*/false);
  TensorStore store(31);
  for (const DType dtype : {DType::BF16, DType::F16})
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{37, 64}, {1000, 2560}, {5, 8}, {24, 20}, {1100, 136}}) {
      const TensorView w = store.make({n, k}, dtype, 1.0f);
      const backend::cuda::DeviceBuffer<uint16_t> device_w = upload(static_cast<const uint16_t*>(w.data), n * k);
      const backend::cuda::DeviceMatrix matrix{device_w.data(), dtype, n, k};
      for (const int64_t rows :
           {int64_t(1), backend::cuda::kMaxSkinnyGemmRows, backend::cuda::kMaxSkinnyGemmRows + 1, int64_t(9)}) {
        const int64_t stride = k + 4;  // a column slice, as dt_proj reads
        const backend::cpu::Matrix x = store.matrix(rows, stride, 1.0f);
        backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), rows * stride);
        backend::cuda::DeviceBuffer<float> y(rows * n);
        backend::cuda::linear_strided(gemm, device_x.data(), stride, rows, matrix, y.data());
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        std::vector<float> expected(size_t(rows * n));
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t o = 0; o < n; ++o) {
            double sum = 0.0;
            for (int64_t i = 0; i < k; ++i) {
              const float value = x.data()[m * stride + i];
              const double rounded = dtype == DType::BF16 ? to_float(to_bf16(value)) : to_float(to_f16(value));
              sum += rounded * double(w.at(o * k + i));
            }
            expected[size_t(m * n + o)] = float(sum);
          }
        expect_close(download(y.data(), rows * n), expected.data(),
                     std::string(dtype_name(dtype)) + " weights [" + std::to_string(n) + ", " + std::to_string(k) +
                         "], " + std::to_string(rows) + " rows",
                     1e-5);
      }
    }
}

// The cuBLASLt GEMMs of many rows (batched decode, prefill) equal the skinny GEMM run on the same rows two at a time:
// two independent kernels, the same rounded inputs, fp32 sums in different orders. Shapes of the 3B model (down_proj
// at 256 rows is where choose_gemm_candidate passes over a split-K candidate on an H200), row counts odd and even;
// x read from a column slice, as dt_proj reads it, so that the narrowed copy and y lie at offsets.
TEST_F(GemmTest, ManyRowsEqualTheSkinnyGemmTwoRowsAtATime) {
  backend::cuda::Gemm gemm(stream_, /*pedantic=*/false);
  TensorStore store(41);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2560, 8192}, {192, 5120}, {5120, 160}}) {
    const TensorView w = store.make({n, k}, DType::BF16, 1.0f);
    const backend::cuda::DeviceBuffer<uint16_t> device_w = upload(static_cast<const uint16_t*>(w.data), n * k);
    const backend::cuda::DeviceMatrix matrix{device_w.data(), DType::BF16, n, k};
    for (const int64_t rows : {int64_t(3), int64_t(64), int64_t(255), int64_t(256)}) {
      const int64_t stride = k + 8;
      const backend::cpu::Matrix x = store.matrix(rows, stride, 1.0f);
      backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), rows * stride);
      backend::cuda::DeviceBuffer<float> y(rows * n + 1), expected(rows * n);
      backend::cuda::linear_strided(gemm, device_x.data(), stride, rows, matrix,
                                    y.data() + 1);  // y 4-byte aligned only
      for (int64_t row = 0; row < rows; row += backend::cuda::kMaxSkinnyGemmRows)
        backend::cuda::linear_strided(gemm, device_x.data() + row * stride, stride,
                                      std::min(backend::cuda::kMaxSkinnyGemmRows, rows - row), matrix,
                                      expected.data() + row * n);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const std::vector<float> want = download(expected.data(), rows * n);
      std::vector<float> got = download(y.data(), rows * n + 1);
      got.erase(got.begin());
      expect_close(got, want.data(),
                   "[" + std::to_string(n) + ", " + std::to_string(k) + "], " + std::to_string(rows) + " rows", 1e-5);
    }
  }
}

// The cuBLASLt candidate: the heuristic's first, unless it splits K and a later unsplit one fills enough of a wave.
TEST(GemmCandidateTest, SplitKFirstGivesWayOnlyToAnUnsplitCandidateFillingAWave) {
  using C = backend::cuda::GemmCandidate;
  const float enough = backend::cuda::kMinWavesWithoutSplitK, short_of = enough - 0.01f;
  EXPECT_EQ(backend::cuda::choose_gemm_candidate(std::vector<C>{{false, 0.1f}, {false, 1.0f}}), 0u);
  EXPECT_EQ(backend::cuda::choose_gemm_candidate(std::vector<C>{{true, 0.5f}}), 0u);
  EXPECT_EQ(backend::cuda::choose_gemm_candidate(std::vector<C>{{true, 0.5f}, {false, enough}, {false, 1.0f}}), 1u);
  EXPECT_EQ(backend::cuda::choose_gemm_candidate(std::vector<C>{{true, 0.5f}, {true, 1.0f}, {false, short_of}}), 0u);
  EXPECT_EQ(backend::cuda::choose_gemm_candidate(std::vector<C>{{true, 0.5f}, {false, short_of}, {false, 0.9f}}), 2u);
}

// SwiGLU fused into the skinny GEMM of stacked gate and up weights (decode) equals the unfused GEMM and then the
// SwiGLU kernel bit for bit: the same sums (one warp an output both ways, which the unfused GEMM takes from
// kMinOutputsOfOneWarp outputs on) and the one swiglu_value; and the 16-bit copy is that output rounded. For one and
// two rows, bf16 and f16 weights, intermediate sizes odd and even; not taken for three rows or fp32 weights.
TEST_F(GemmTest, SwiGluFusedIntoTheSkinnyGemmEqualsGemmThenSwiGlu) {
  backend::cuda::Gemm gemm(stream_, /*pedantic=*/false);
  TensorStore store(37);
  constexpr int64_t kWidth = 264;  // K: a multiple of one 16-byte load of 16-bit weights
  constexpr int64_t kOdd = backend::cuda::kMinOutputsOfOneWarp / 2 + 1;
  static_assert(kOdd % 2 == 1, "an odd intermediate size");
  for (const DType dtype : {DType::BF16, DType::F16})
    for (const int64_t intermediate : {kOdd, int64_t(1024)}) {
      const int64_t n = 2 * intermediate;
      const TensorView w = store.make({n, kWidth}, dtype, 1.0f);
      const backend::cuda::DeviceBuffer<uint16_t> device_w = upload(static_cast<const uint16_t*>(w.data), n * kWidth);
      const backend::cuda::DeviceMatrix matrix{device_w.data(), dtype, n, kWidth};
      for (const int64_t rows : {int64_t(1), backend::cuda::kMaxSkinnyGemmRows}) {
        const std::string where = std::string(dtype_name(dtype)) + ", I " + std::to_string(intermediate) + ", " +
                                  std::to_string(rows) + " rows";
        const backend::cpu::Matrix x = store.matrix(rows, kWidth, 1.0f);
        backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), rows * kWidth);
        ASSERT_TRUE(backend::cuda::linear_swiglu_fuses(gemm, device_x.data(), rows, matrix, {})) << where;
        backend::cuda::DeviceBuffer<float> gate_up(rows * n), unfused(rows * intermediate), fused(rows * intermediate);
        backend::cuda::DeviceBuffer<uint16_t> fused16(rows * intermediate);
        backend::cuda::linear(gemm, device_x.data(), rows, matrix, gate_up.data());
        backend::cuda::swiglu(gate_up.data(), rows, intermediate, unfused.data(), stream_);
        backend::cuda::linear_swiglu(gemm, device_x.data(), rows, matrix, {}, fused.data(), {fused16.data(), dtype});
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        const std::vector<float> out = download(fused.data(), rows * intermediate);
        const std::vector<float> expected = download(unfused.data(), rows * intermediate);
        EXPECT_TRUE(bitwise_equal(out.data(), expected.data(), rows * intermediate)) << "fused SwiGLU, " << where;
        std::vector<uint16_t> copy(size_t(rows * intermediate));
        ASSERT_EQ(cudaMemcpy(copy.data(), fused16.data(), copy.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < copy.size(); ++i) {
          const uint16_t rounded = dtype == DType::BF16 ? to_bf16(out[i]).bits : to_f16(out[i]).bits;
          ASSERT_EQ(copy[i], rounded) << "16-bit copy at " << i << ", " << where;
        }
      }
      backend::cuda::DeviceBuffer<float> three_rows(3 * kWidth);
      EXPECT_FALSE(backend::cuda::linear_swiglu_fuses(gemm, three_rows.data(), 3, matrix, {}));
    }
  backend::cuda::DeviceBuffer<float> weights(8 * 8), x(8);
  EXPECT_FALSE(backend::cuda::linear_swiglu_fuses(gemm, x.data(), 1, {weights.data(), DType::F32, 8, 8}, {}));
}

// Grouped skinny GEMMs (the experts') with group_ids: launch rows listing only the groups with rows, then -1s (or
// in any order), compute what a launch row per group computes, bit for bit; a group without rows and the -1 rows
// touch nothing, and three launch rows for three groups with rows leave none unwritten.
TEST_F(GemmTest, GroupIdsListingTheGroupsWithRowsEqualEveryGroupLaunched) {
  constexpr int64_t kGroups = 4, kN = 40, kK = 64;
  TensorStore store(43);
  const std::vector<int64_t> group_rows = {0, 2, 2, 5, 6};  // group 1 has no rows
  const int64_t num_rows = group_rows.back();
  std::vector<backend::cuda::DeviceBuffer<uint16_t>> weights;
  std::vector<const void*> weight_pointers;
  for (int64_t g = 0; g < kGroups; ++g) {
    const TensorView w = store.make({kN, kK}, DType::BF16, 1.0f);
    weights.push_back(upload(static_cast<const uint16_t*>(w.data), kN * kK));
    weight_pointers.push_back(weights.back().data());
  }
  const backend::cuda::DeviceBuffer<const void*> device_weights = upload(weight_pointers.data(), kGroups);
  const backend::cuda::DeviceBuffer<int64_t> device_group_rows = upload(group_rows.data(), kGroups + 1);
  const backend::cpu::Matrix x = store.matrix(num_rows, kK, 1.0f);
  backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), num_rows * kK);

  const auto run = [&](const std::vector<int32_t>& ids) {
    backend::cuda::DeviceBuffer<int32_t> device_ids;
    if (!ids.empty()) device_ids = upload(ids.data(), int64_t(ids.size()));
    backend::cuda::DeviceBuffer<float> y(num_rows * kN);
    EXPECT_EQ(cudaMemset(y.data(), 0xff, size_t(num_rows * kN) * 4), cudaSuccess);  // NaN where nothing writes
    backend::cuda::SkinnyGemm p;
    p.x = device_x.data(), p.x_stride = kK, p.group_rows = device_group_rows.data();
    p.group_ids = ids.empty() ? nullptr : device_ids.data();
    p.num_groups = ids.empty() ? kGroups : int64_t(ids.size());
    p.weights = device_weights.data(), p.dtype = DType::BF16, p.n = kN, p.k = kK, p.y = y.data();
    EXPECT_TRUE(backend::cuda::skinny_gemm_applies(p));
    backend::cuda::skinny_gemm(p, stream_);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return download(y.data(), num_rows * kN);
  };
  const std::vector<float> every_group = run({});
  for (const float value : every_group) ASSERT_FALSE(std::isnan(value));
  for (const std::vector<int32_t>& ids :
       {std::vector<int32_t>{0, 2, 3, -1}, std::vector<int32_t>{0, 2, 3}, std::vector<int32_t>{3, -1, 0, 2}}) {
    const std::vector<float> listed = run(ids);
    EXPECT_EQ(std::memcmp(listed.data(), every_group.data(), listed.size() * 4), 0)
        << ids.size() << " launch rows, the first " << ids[0];
  }
  backend::cuda::SkinnyGemm dense;  // group_ids need group_rows
  dense.x = device_x.data(), dense.x_stride = kK, dense.num_rows = 1, dense.weight = weights[0].data();
  dense.dtype = DType::BF16, dense.n = kN, dense.k = kK;
  backend::cuda::DeviceBuffer<int32_t> ids(1);
  dense.group_ids = ids.data();
  EXPECT_FALSE(backend::cuda::skinny_gemm_applies(dense));
}

class NormTest : public StreamTest {};

// The RMSNorms hold a row in registers, up to 8 values a thread of up to 1024 threads (embedding_norm.cu): widths
// from part of a warp's worth to the widest, alone and fused with the residual add, against the CPU twin; a wider
// row is refused with an error.
TEST_F(NormTest, RowsUpTo8192WideEqualTheCpuTwin) {
  TensorStore store(47);
  constexpr int64_t kRows = 3;
  constexpr float kEps = 1e-6f;
  for (const int64_t width : {int64_t(33), int64_t(2560), int64_t(5000), int64_t(8192)}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const int64_t count = kRows * width;
    const TensorView weight = store.make({width}, DType::F32, 1.0f);
    backend::cuda::DeviceBuffer<float> device_weight = upload(static_cast<const float*>(weight.data), width);
    const backend::cpu::Matrix hidden = store.matrix(kRows, width, 1.0f), update = store.matrix(kRows, width, 1.0f);
    backend::cpu::Matrix sum = hidden;
    backend::cpu::add_in_place(sum, update);
    backend::cpu::Matrix expected;
    backend::cpu::rms_norm_rows(sum, weight, kEps, expected);

    backend::cuda::DeviceBuffer<float> device_hidden = upload(hidden.data(), count),
                                       device_update = upload(update.data(), count);
    backend::cuda::DeviceBuffer<float> normed(count), alone(count);
    backend::cuda::add_rms_norm(device_hidden.data(), device_update.data(), kRows, width, device_weight.data(), kEps,
                                normed.data(), stream_);
    backend::cuda::rms_norm(device_hidden.data(), width, kRows, width, device_weight.data(), kEps, alone.data(), width,
                            stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    expect_close(download(device_hidden.data(), count), sum.data(), "add_rms_norm's sum");
    expect_close(download(normed.data(), count), expected.data(), "add_rms_norm");
    expect_close(download(alone.data(), count), expected.data(), "rms_norm");
  }
  backend::cuda::DeviceBuffer<float> wide(8193);
  EXPECT_THROW(backend::cuda::rms_norm(wide.data(), 8193, 1, 8193, wide.data(), kEps, wide.data(), 8193, stream_),
               Error);
}

class TensorCoreAttentionTest : public StreamTest {
 protected:
  struct Shape {
    int64_t num_heads, num_kv_heads, head_dim;
  };

  // paged_attention in the bf16 mode against the fp32 mode on the same queries and paged keys and values, for
  // rows of num_tokens[r] tokens from start_positions[r] (up to 320 positions a row, in blocks of 16 interleaved
  // over the pool as a pool in use has them; rows past the fifth share the blocks of the first five). bf16 inputs
  // carry a relative error of 2^-9 each; the outputs, softmax averages of values, stay within 1% of the largest.
  void expect_close_to_fp32(const Shape& shape, const std::vector<int64_t>& num_tokens,
                            const std::vector<int64_t>& start_positions, const std::string& what) {
    constexpr int64_t kBlockSize = 16, kBlocksPerRow = 20, kMaxTables = 5;
    TensorStore store(41);
    backend::cuda::StepRowsUploader uploader;
    backend::cuda::KvLayout layout;
    layout.block_size = kBlockSize;
    layout.num_kv_heads = shape.num_kv_heads;
    layout.head_dim = shape.head_dim;
    layout.block_stride = 2 * kBlockSize * layout.token_stride();
    const int64_t num_rows = int64_t(num_tokens.size()), num_tables = std::min(num_rows, kMaxTables);
    const int64_t num_blocks = num_tables * kBlocksPerRow;
    const backend::cpu::Matrix pool =
        store.matrix(num_blocks, layout.block_stride, 1.0f);  // every position holds a key
    backend::cuda::DeviceBuffer<float> device_pool = upload(pool.data(), num_blocks * layout.block_stride);

    std::vector<std::vector<int32_t>> tables;
    for (int64_t r = 0; r < num_tables; ++r) {
      tables.emplace_back(size_t(kBlocksPerRow));
      for (int64_t b = 0; b < kBlocksPerRow; ++b) tables.back()[size_t(b)] = int32_t(b * num_tables + r);
    }
    const int64_t total = std::accumulate(num_tokens.begin(), num_tokens.end(), int64_t(0));
    const std::vector<int32_t> tokens(size_t(total), 0);
    std::vector<backend::BatchRow> rows;
    int64_t first = 0;
    for (int64_t r = 0; r < num_rows; ++r) {
      backend::BatchRow row;
      row.tokens = std::span<const int32_t>(tokens).subspan(size_t(first), size_t(num_tokens[size_t(r)]));
      row.start_position = start_positions[size_t(r)];
      row.block_table = tables[size_t(r % num_tables)];
      rows.push_back(row);
      first += num_tokens[size_t(r)];
    }
    const std::vector<int64_t> offsets(size_t(num_rows), 0);
    const std::vector<int32_t> reads(size_t(num_rows), 1);
    const backend::cuda::DeviceRows device_rows = uploader.upload(rows, offsets, reads, {}, stream_);
    ASSERT_EQ(backend::cuda::attention_runs_on_tensor_cores(layout, shape.num_heads, true),
              shape.num_heads / shape.num_kv_heads <= 64);  // wider groups: the fp32 kernel

    const int64_t width = shape.num_heads * shape.head_dim;
    const backend::cpu::Matrix queries =
        store.matrix(total, width, 4.0f);  // scores of spread ~1.3: peaked softmax weights
    backend::cuda::DeviceBuffer<float> device_queries = upload(queries.data(), total * width);
    std::vector<std::vector<float>> outputs;
    for (const bool sixteen_bit : {false, true}) {
      backend::cuda::DeviceBuffer<float> context(total * width), partial;
      backend::cuda::paged_attention(device_rows, layout, shape.num_heads, device_queries.data(), device_pool.data(),
                                     context.data(), partial, sixteen_bit, stream_);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      outputs.push_back(download(context.data(), total * width));
    }
    expect_close(outputs[1], outputs[0].data(),
                 what + ", " + std::to_string(shape.num_heads) + " heads, " + std::to_string(shape.num_kv_heads) +
                     " KV heads, dimension " + std::to_string(shape.head_dim),
                 1e-2);
  }

  // MQA, GQA, MHA; a group of 64 heads (four full warps), and one of 72, whose one-token rows take the fp32 kernel.
  static constexpr Shape kShapes[] = {{20, 1, 128}, {8, 2, 64}, {4, 4, 16}, {64, 1, 32}, {72, 1, 16}};
};

// Rows of several tokens (attention_mma_kernel): spanning several 64-token chunks, continuing a cached prefix or
// not, beside a one-token row (attention_decode_mma_kernel); head dimensions 16 to 128.
TEST_F(TensorCoreAttentionTest, PrefillMatchesFp32Attention) {
  for (const Shape shape : kShapes) expect_close_to_fp32(shape, {150, 1, 64, 3, 65}, {37, 200, 0, 5, 64}, "prefill");
}

// Rows of one token (attention_decode_mma_kernel): five rows, whose keys split 32 ways (some splits empty: the
// row at position 0 has one key), and 540 rows, whose keys take one split.
TEST_F(TensorCoreAttentionTest, DecodeMatchesFp32Attention) {
  std::vector<int64_t> positions(540);
  for (size_t r = 0; r < positions.size(); ++r) positions[r] = int64_t(r * 37 % 320);
  for (const Shape shape : kShapes) {
    expect_close_to_fp32(shape, std::vector<int64_t>(5, 1), {0, 1, 63, 64, 319}, "decode, 32 splits");
    expect_close_to_fp32(shape, std::vector<int64_t>(positions.size(), 1), positions, "decode, one split");
  }
}

// skinny_gemm reads each expert matrix's K in whole 16-byte loads: experts whose gate_up or down_proj does not
// allow it run per expert, whatever the other matrix allows (no GPU needed: only shapes and types are read).
TEST(ExpertGemmsTest, GroupedOnlyWhereEveryMatrixTakesWholeLoads) {
  backend::cuda::DeviceMoe moe;
  moe.experts.push_back({{nullptr, DType::BF16, 16, 8}, {nullptr, DType::BF16, 8, 8}});  // H = 8, I = 8
  EXPECT_TRUE(backend::cuda::experts_run_grouped(moe, 1));
  EXPECT_FALSE(backend::cuda::experts_run_grouped(moe, backend::cuda::kMaxGroupedTokens + 1));
  // H = 12: a whole number of fp32 loads (down_proj's type here) but not of bf16 ones (gate_up's).
  moe.experts[0] = {{nullptr, DType::BF16, 16, 12}, {nullptr, DType::F32, 12, 8}};
  EXPECT_FALSE(backend::cuda::experts_run_grouped(moe, 1));
  EXPECT_FALSE(backend::cuda::experts_run_grouped(moe, 1, backend::cuda::ExpertGemms::Grouped));
}

class NarrowCopyTest : public StreamTest {};

// A norm's 16-bit copy of its output (narrow16.h) is exactly the GEMM's own rounding of it, and a GEMM given that
// copy computes exactly what it computes rounding the input itself.
TEST_F(NarrowCopyTest, NormCopiesEqualTheGemmsOwnRounding) {
  backend::cuda::Gemm gemm(stream_, /*pedantic=*/false);
  TensorStore store(43);
  constexpr int64_t kRows = 29, kWidth = 96, kOutputs = 40;
  for (const DType dtype : {DType::BF16, DType::F16}) {
    const backend::cpu::Matrix x = store.matrix(kRows, kWidth, 2.0f);
    const backend::cpu::Matrix norm_weight = store.matrix(1, kWidth, 1.0f);
    const TensorView w = store.make({kOutputs, kWidth}, dtype, 1.0f);
    backend::cuda::DeviceBuffer<float> device_x = upload(x.data(), kRows * kWidth);
    backend::cuda::DeviceBuffer<float> device_norm = upload(norm_weight.data(), kWidth);
    const backend::cuda::DeviceBuffer<uint16_t> device_w =
        upload(static_cast<const uint16_t*>(w.data), kOutputs * kWidth);
    const backend::cuda::DeviceMatrix matrix{device_w.data(), dtype, kOutputs, kWidth};
    backend::cuda::DeviceBuffer<float> normed(kRows * kWidth), fused(kRows * kOutputs), separate(kRows * kOutputs);
    backend::cuda::DeviceBuffer<uint16_t> copy(kRows * kWidth), rounded(kRows * kWidth);
    const backend::cuda::Narrow16 normed16{copy.data(), dtype};
    backend::cuda::rms_norm(device_x.data(), kWidth, kRows, kWidth, device_norm.data(), 1e-6f, normed.data(), kWidth,
                            stream_, normed16);
    backend::cuda::narrow_to_16(normed.data(), kWidth, kRows, kWidth, dtype == DType::BF16, rounded.data(), stream_);
    // All rows (cuBLAS), and one and two rows (skinny_gemm, which reads the copy instead of rounding x).
    for (const int64_t num_rows : {kRows, int64_t(1), int64_t(2)}) {
      backend::cuda::linear(gemm, normed.data(), num_rows, matrix, fused.data(), normed16);
      backend::cuda::linear(gemm, normed.data(), num_rows, matrix, separate.data());
      EXPECT_EQ(download(fused.data(), num_rows * kOutputs), download(separate.data(), num_rows * kOutputs))
          << dtype_name(dtype) << ", " << num_rows << " rows";
    }
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<uint16_t> copy_bits(size_t(kRows * kWidth)), rounded_bits(size_t(kRows * kWidth));
    ASSERT_EQ(cudaMemcpy(copy_bits.data(), copy.data(), copy_bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(rounded_bits.data(), rounded.data(), rounded_bits.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(copy_bits, rounded_bits) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace jambo::testing
