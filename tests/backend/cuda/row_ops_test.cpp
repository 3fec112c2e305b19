// The kernels that move rows, each against its CPU twin on its own (the mixer and end-to-end tests run them only
// inside larger computations): gather_rows (the embedding lookup, the MoE gather), gather_rms_norm (the final norm
// of the tokens whose logits are asked for) and store_keys_and_values (this step's keys and values into the paged
// KV pool, also past element 2^32).
#include "support/random_tensors.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/vector_ops.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/convert.h"
#include "backend/cuda/embedding_norm.h"
#include "backend/cuda/step_rows.h"
#include "cuda_test_util.h"

#include <numeric>

namespace jambo::testing {
namespace {

using backend::cpu::Matrix;
using backend::cuda::DeviceBuffer;

// One row of a step: its token count, its first position and whether it scores its tokens (every position's
// logits) or samples (the last position's).
struct RowSpec {
  int64_t num_tokens, start_position;
  bool scores_every_position = false;
};

// The step's rows as the backend builds them, each with its own block table; tokens, slots and targets are
// placeholders (the kernels here read none of them, only which positions have logits).
class StepRows {
 public:
  StepRows(const std::vector<RowSpec>& specs, const std::vector<std::vector<int32_t>>& block_tables)
      : tables_(block_tables) {
    const int64_t total = std::accumulate(specs.begin(), specs.end(), int64_t(0),
                                          [](int64_t sum, const RowSpec& row) { return sum + row.num_tokens; });
    tokens_.assign(size_t(total), 0);
    int64_t first = 0;
    for (size_t r = 0; r < specs.size(); ++r) {
      backend::BatchRow row;
      row.tokens = std::span<const int32_t>(tokens_).subspan(size_t(first), size_t(specs[r].num_tokens));
      row.start_position = specs[r].start_position;
      row.block_table = tables_[r];
      if (specs[r].scores_every_position) row.copy_logits = backend::LogitsCopy::All;
      rows.push_back(row);
      cpu_rows.push_back({first, specs[r].num_tokens, specs[r].start_position, tables_[r]});
      first += specs[r].num_tokens;
    }
  }
  int64_t num_tokens() const { return int64_t(tokens_.size()); }
  backend::cuda::DeviceRows upload(cudaStream_t stream) {
    const std::vector<int64_t> offsets(rows.size(), 0);
    const std::vector<int32_t> reads(rows.size(), 1);
    return uploader_.upload(rows, offsets, reads, {}, stream);
  }

  std::vector<backend::BatchRow> rows;
  std::vector<backend::cpu::AttentionRow> cpu_rows;

 private:
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> tokens_;
  backend::cuda::StepRowsUploader uploader_;
};

class RowOpsTest : public StreamTest {};

// out[r] = table[indices[r]] exactly, as the CPU backend's embedding copies rows: indices out of order, repeated,
// the first and the last row of the table; widths from one value to the 3B shape's hidden size.
TEST_F(RowOpsTest, GatherRowsCopiesTheIndexedRows) {
  TensorStore store(53);
  constexpr int64_t kTableRows = 50;
  const std::vector<int32_t> indices = {49, 0, 7, 7, 23, 49, 1};
  const int64_t num_rows = int64_t(indices.size());
  const backend::cuda::DeviceBuffer<int32_t> device_indices = upload(indices.data(), num_rows);
  for (const int64_t width : {int64_t(1), int64_t(33), int64_t(2560)}) {
    const backend::cpu::Matrix table = store.matrix(kTableRows, width, 1.0f);
    const backend::cuda::DeviceBuffer<float> device_table = upload(table.data(), kTableRows * width);
    backend::cuda::DeviceBuffer<float> out(num_rows * width);
    backend::cuda::gather_rows(device_table.data(), device_indices.data(), num_rows, width, out.data(), stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<float> expected;
    for (const int32_t index : indices) expected.insert(expected.end(), table.row(index), table.row(index) + width);
    EXPECT_EQ(download(out.data(), num_rows * width), expected) << "width " << width;
  }
}

// The final norm over the tokens whose logits the step asks for (the last of a sampling row, every one of a scoring
// row), as the CPU backend computes it, vector by vector; its 16-bit copy is exactly the fp32 output rounded.
TEST_F(RowOpsTest, GatherRmsNormNormalizesTheTokensWithLogits) {
  TensorStore store(59);
  constexpr float kEps = 1e-6f;
  const std::vector<RowSpec> specs = {{4, 0, true}, {3, 9}, {1, 30}, {5, 2, true}, {1, 0, true}};
  const std::vector<int64_t> selected = {0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13};  // step token of each vector
  StepRows step(specs, std::vector<std::vector<int32_t>>(specs.size(), std::vector<int32_t>(4, 0)));
  const backend::cuda::DeviceRows rows = step.upload(stream_);
  ASSERT_EQ(rows.num_vectors, int64_t(selected.size()));
  for (const int64_t width : {int64_t(33), int64_t(2560)}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const TensorView weight = store.make({width}, DType::F32, 1.0f);
    const backend::cuda::DeviceBuffer<float> device_weight = upload(static_cast<const float*>(weight.data), width);
    const backend::cpu::Matrix hidden = store.matrix(step.num_tokens(), width, 2.0f);
    const backend::cuda::DeviceBuffer<float> device_hidden = upload(hidden.data(), step.num_tokens() * width);
    const int64_t count = rows.num_vectors * width;
    backend::cpu::Matrix expected(rows.num_vectors, width);
    for (int64_t v = 0; v < rows.num_vectors; ++v)
      backend::cpu::rms_norm(hidden.row(selected[v]), weight, kEps, expected.row(v));

    for (const DType narrow : {DType::BF16, DType::F16}) {
      backend::cuda::DeviceBuffer<float> out(count);
      backend::cuda::DeviceBuffer<uint16_t> copy(count), rounded(count);
      backend::cuda::gather_rms_norm(rows, device_hidden.data(), width, device_weight.data(), kEps, out.data(), stream_,
                                     {copy.data(), narrow});
      backend::cuda::narrow_to_16(out.data(), width, rows.num_vectors, width, narrow == DType::BF16, rounded.data(),
                                  stream_);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const std::vector<float> actual = download(out.data(), count);
      for (int64_t i = 0; i < count; ++i)
        ASSERT_NEAR(actual[size_t(i)], expected.data()[i], 1e-5 * (1.0 + std::fabs(expected.data()[i])))
            << "vector " << i / width << ", column " << i % width;
      EXPECT_EQ(download(copy.data(), count), download(rounded.data(), count)) << dtype_name(narrow) << " copy";
    }
  }
}

// Two attention layers' keys and values stored by the CPU twin and by store_keys_and_values into a pool whose rows'
// blocks start at a given block: rows from position 0 across block boundaries, at a block's last and a next block's
// first position, continuing mid-block, beside others; block tables interleave the rows' blocks.
class KvStoreTest : public StreamTest {
 protected:
  static constexpr int64_t kBlockSize = 16, kBlocksPerRow = 6, kNumHeads = 4;
  // The rows' blocks on the GPU and the pool holding them.
  struct GpuPool {
    std::unique_ptr<StepRows> step;
    backend::cuda::DeviceRows rows;
    backend::cuda::DeviceBuffer<float> pool;  // [first_block + num_blocks, block_stride]
  };

  void SetUp() override {
    StreamTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    layout_.block_size = kBlockSize;
    layout_.num_kv_heads = config_.num_key_value_heads;
    layout_.head_dim = config_.head_dim;
    layout_.block_stride = config_.num_attention_layers() * 2 * layout_.half_stride();  // 8192
    const int64_t num_tokens = std::accumulate(kSpecs.begin(), kSpecs.end(), int64_t(0),
                                               [](int64_t sum, const RowSpec& row) { return sum + row.num_tokens; });
    for (int64_t layer = 0; layer < config_.num_attention_layers(); ++layer) {
      keys_.push_back(store_.matrix(num_tokens, layout_.token_stride(), 1.0f));
      values_.push_back(store_.matrix(num_tokens, layout_.token_stride(), 1.0f));
    }
    StepRows step(kSpecs, block_tables(0));
    for (int64_t layer = 0; layer < config_.num_attention_layers(); ++layer)
      for (const backend::cpu::AttentionRow& row : step.cpu_rows)
        backend::cpu::store_keys_and_values(cpu_cache_, layer, row, keys_[size_t(layer)], values_[size_t(layer)]);
  }

  std::vector<std::vector<int32_t>> block_tables(int64_t first_block) const {
    std::vector<std::vector<int32_t>> tables(kSpecs.size());
    for (size_t r = 0; r < kSpecs.size(); ++r)
      for (int64_t b = 0; b < kBlocksPerRow; ++b)
        tables[r].push_back(int32_t(first_block + b * int64_t(kSpecs.size()) + int64_t(r)));
    return tables;
  }

  std::unique_ptr<GpuPool> store_on_gpu(int64_t first_block) {
    auto gpu = std::make_unique<GpuPool>();
    gpu->step = std::make_unique<StepRows>(kSpecs, block_tables(first_block));
    gpu->rows = gpu->step->upload(stream_);
    const int64_t pool_size = (first_block + kNumBlocks) * layout_.block_stride;
    gpu->pool = backend::cuda::DeviceBuffer<float>(pool_size);
    EXPECT_EQ(cudaMemsetAsync(gpu->pool.data(), 0, size_t(pool_size) * sizeof(float), stream_), cudaSuccess);
    for (int64_t layer = 0; layer < config_.num_attention_layers(); ++layer) {
      const backend::cpu::Matrix& keys = keys_[size_t(layer)];
      const backend::cuda::DeviceBuffer<float> device_keys = upload(keys.data(), keys.num_rows() * keys.num_cols());
      const backend::cuda::DeviceBuffer<float> device_values =
          upload(values_[size_t(layer)].data(), keys.num_rows() * keys.num_cols());
      backend::cuda::KvLayout layout = layout_;
      layout.layer_offset = layer * 2 * layout.half_stride();
      backend::cuda::store_keys_and_values(gpu->rows, layout, device_keys.data(), device_values.data(),
                                           gpu->pool.data(), stream_);
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);  // before the inputs are freed
    }
    return gpu;
  }

  // The GPU pool's blocks from first_block on equal the CPU cache's whole pool (the same layout).
  void expect_equal_to_cpu(const GpuPool& gpu, int64_t first_block) {
    const std::vector<float> written =
        download(gpu.pool.data() + first_block * layout_.block_stride, kNumBlocks * layout_.block_stride);
    EXPECT_TRUE(std::equal(written.begin(), written.end(), cpu_cache_.key(0, 0, 0))) << "blocks from " << first_block;
  }

  // Attention over the second layer's keys and values, fp32 or on the tensor cores.
  std::vector<float> attend(const GpuPool& gpu, const backend::cpu::Matrix& queries, bool sixteen_bit) {
    backend::cuda::KvLayout layout = layout_;
    layout.layer_offset = 2 * layout.half_stride();
    const int64_t count = queries.num_rows() * queries.num_cols();
    const backend::cuda::DeviceBuffer<float> device_queries = upload(queries.data(), count);
    backend::cuda::DeviceBuffer<float> context(count), partial;
    backend::cuda::paged_attention(gpu.rows, layout, kNumHeads, device_queries.data(), gpu.pool.data(), context.data(),
                                   partial, sixteen_bit, stream_);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return download(context.data(), count);
  }

  inline static const std::vector<RowSpec> kSpecs = {{37, 0}, {1, 15}, {1, 16}, {20, 5}, {3, 60}};
  inline static const int64_t kNumBlocks = int64_t(kSpecs.size()) * kBlocksPerRow;
  const model::JambaConfig config_ = config_with_two_attention_layers();
  backend::cuda::KvLayout layout_;
  TensorStore store_{61};
  std::vector<backend::cpu::Matrix> keys_, values_;  // [layer][T, nkv*hd]
  backend::cpu::KvCache cpu_cache_{config_, backend::CacheConfig{1, kNumBlocks, kBlockSize}};

 private:
  static model::JambaConfig config_with_two_attention_layers() {
    model::JambaConfig config;
    config.num_key_value_heads = 2;
    config.head_dim = 64;
    config.mixer_kinds = {model::MixerKind::Attention, model::MixerKind::Mamba, model::MixerKind::Attention};
    return config;
  }
};

TEST_F(KvStoreTest, EqualsTheCpuTwin) { expect_equal_to_cpu(*store_on_gpu(0), 0); }

// From block 2^19 on, the pool's blocks of 8192 elements start at element 2^32 (a pool of 17 GB): the blocks there
// equal the CPU cache's, the pool's first blocks, where a 32-bit offset would land, stay zero, and attention over
// them (fp32 and tensor cores) equals attention over the same keys and values in a pool's first blocks.
TEST_F(KvStoreTest, PastElementTwoToThe32EqualsTheCpuTwin) {
  constexpr int64_t kFirstBlock = int64_t(1) << 19;
  const std::unique_ptr<GpuPool> high = store_on_gpu(kFirstBlock);
  expect_equal_to_cpu(*high, kFirstBlock);
  const std::vector<float> low = download(high->pool.data(), kNumBlocks * layout_.block_stride);
  EXPECT_TRUE(std::all_of(low.begin(), low.end(), [](float value) { return value == 0.0f; }))
      << "a write landed in the pool's first blocks";

  const std::unique_ptr<GpuPool> reference = store_on_gpu(0);
  const backend::cpu::Matrix queries = store_.matrix(high->step->num_tokens(), kNumHeads * config_.head_dim, 1.0f);
  for (const bool sixteen_bit : {false, true})
    EXPECT_EQ(attend(*high, queries, sixteen_bit), attend(*reference, queries, sixteen_bit))
        << (sixteen_bit ? "tensor-core" : "fp32") << " attention";
}

}  // namespace
}  // namespace jambo::testing
