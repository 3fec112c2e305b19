// Tensor-parallel shards (model/tensor_parallel.h): on every fixture model and every rank count it can be split over,
// the shards' slices put back together (rows after rows, columns beside columns, u and z parts each) are the
// checkpoint's tensors bit for bit; replicated tensors are the checkpoint's own; a row-parallel bias is rank 0's only;
// where the model cannot be split, the reason names what does not divide. A described random model (no host data:
// the CUDA backend generates its weights on the GPU) splits into shards whose recipes give every slice's bytes.
#include "model/tensor_parallel.h"
#include "checkpoint_builder.h"
#include "core/error.h"
#include "model/random_weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace jambo::model {
namespace {

const std::vector<std::string> kFixtures = {"attn-heavy-tied-bf16",   "dense-gqa1-projbias-fp32", "fused-experts-fp32",
                                            "moe-top1-mqa-tied-bf16", "moe-top2-gqa2-fp32",       "mqa-top2-tied-fp32",
                                            "sharded-gqa4-bf16"};

Model fixture(const std::string& name) {
  return load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

std::vector<char> bytes_of(const TensorView& view) {
  const char* data = static_cast<const char*>(view.data);
  return {data, data + view.numel() * dtype_size(view.dtype)};
}

// The shards' views of one tensor joined along rows (each shard's rows in `parts` blocks, joined block by block) or
// along columns.
std::vector<char> joined_rows(const std::vector<TensorView>& shards, int64_t parts) {
  std::vector<char> out;
  for (int64_t p = 0; p < parts; ++p)
    for (const TensorView& shard : shards) {
      const std::vector<char> bytes = bytes_of(shard);
      const size_t part = bytes.size() / size_t(parts);
      out.insert(out.end(), bytes.begin() + long(part * size_t(p)), bytes.begin() + long(part * size_t(p + 1)));
    }
  return out;
}

std::vector<char> joined_columns(const std::vector<TensorView>& shards) {
  std::vector<char> out;
  for (int64_t r = 0; r < shards[0].rows(); ++r)
    for (const TensorView& shard : shards) {
      const int64_t row_bytes = shard.cols() * dtype_size(shard.dtype);
      const char* row = static_cast<const char*>(shard.data) + r * row_bytes;
      out.insert(out.end(), row, row + row_bytes);
    }
  return out;
}

template <typename Pick>
std::vector<TensorView> of_shards(const std::vector<Model>& shards, const Pick& pick) {
  std::vector<TensorView> views;
  for (const Model& shard : shards) views.push_back(pick(shard.weights));
  return views;
}

void expect_mlp_joins(const std::vector<Model>& shards, const MlpWeights& whole,
                      const std::function<const MlpWeights&(const ModelWeights&)>& mlp, const std::string& what) {
  EXPECT_EQ(joined_rows(of_shards(shards, [&](const ModelWeights& w) { return mlp(w).gate_proj; }), 1),
            bytes_of(whole.gate_proj)) << what;
  EXPECT_EQ(joined_rows(of_shards(shards, [&](const ModelWeights& w) { return mlp(w).up_proj; }), 1),
            bytes_of(whole.up_proj)) << what;
  EXPECT_EQ(joined_columns(of_shards(shards, [&](const ModelWeights& w) { return mlp(w).down_proj; })),
            bytes_of(whole.down_proj)) << what;
}

TEST(TensorParallel, ShardsJoinBackIntoTheCheckpointBitForBit) {
  int64_t num_checked = 0;
  for (const std::string& name : kFixtures)
    for (const int64_t size : {2, 3, 4}) {
      const Model model = fixture(name);
      if (!tensor_parallel_obstacle(model.config, size).empty()) continue;
      SCOPED_TRACE(name + " over " + std::to_string(size) + " ranks");
      std::vector<Model> shards;
      for (int64_t rank = 0; rank < size; ++rank) shards.push_back(shard_model(model, rank, size));
      for (size_t l = 0; l < model.weights.layers.size(); ++l) {
        const LayerWeights& layer = model.weights.layers[l];
        const std::string what = "layer " + std::to_string(l);
        const auto layer_of = [l](const ModelWeights& w) -> const LayerWeights& { return w.layers[l]; };
        EXPECT_EQ(bytes_of(layer_of(shards[1].weights).input_norm), bytes_of(layer.input_norm)) << what;
        if (layer.mixer == MixerKind::Mamba) {
          const auto m = [&](const ModelWeights& w) -> const MambaWeights& { return layer_of(w).mamba; };
          EXPECT_EQ(joined_rows(of_shards(shards, [&](const ModelWeights& w) { return m(w).in_proj; }), 2),
                    bytes_of(layer.mamba.in_proj)) << what;
          for (const auto field : {&MambaWeights::conv_weight, &MambaWeights::conv_bias, &MambaWeights::dt_proj,
                                   &MambaWeights::dt_proj_bias, &MambaWeights::A_log, &MambaWeights::D})
            if (!(layer.mamba.*field).empty()) {
              EXPECT_EQ(joined_rows(of_shards(shards, [&](const ModelWeights& w) { return m(w).*field; }), 1),
                        bytes_of(layer.mamba.*field)) << what;
            }
          for (const auto field : {&MambaWeights::x_proj, &MambaWeights::out_proj})
            EXPECT_EQ(joined_columns(of_shards(shards, [&](const ModelWeights& w) { return m(w).*field; })),
                      bytes_of(layer.mamba.*field)) << what;
          EXPECT_EQ(bytes_of(m(shards[1].weights).b_norm), bytes_of(layer.mamba.b_norm)) << what;
          EXPECT_EQ(m(shards[1].weights).out_proj_bias.empty(), true) << what;
        } else {
          const auto a = [&](const ModelWeights& w) -> const AttentionWeights& { return layer_of(w).attention; };
          EXPECT_EQ(joined_rows(of_shards(shards, [&](const ModelWeights& w) { return a(w).q_proj; }), 1),
                    bytes_of(layer.attention.q_proj)) << what;
          EXPECT_EQ(joined_columns(of_shards(shards, [&](const ModelWeights& w) { return a(w).o_proj; })),
                    bytes_of(layer.attention.o_proj)) << what;
          if (model.config.num_key_value_heads % size == 0) {
            EXPECT_EQ(joined_rows(of_shards(shards, [&](const ModelWeights& w) { return a(w).k_proj; }), 1),
                      bytes_of(layer.attention.k_proj)) << what;
          } else {  // fewer KV heads than ranks: each rank's one, the KV head its query heads read
            for (int64_t rank = 0; rank < size; ++rank) {
              const int64_t head = rank * model.config.num_key_value_heads / size, bytes_per_head =
                  model.config.head_dim * model.config.hidden_size * dtype_size(layer.attention.v_proj.dtype);
              const std::vector<char> whole = bytes_of(layer.attention.v_proj);
              EXPECT_EQ(bytes_of(a(shards[size_t(rank)].weights).v_proj),
                        std::vector<char>(whole.begin() + head * bytes_per_head,
                                          whole.begin() + (head + 1) * bytes_per_head)) << what << " rank " << rank;
            }
          }
        }
        if (layer.ffn == FfnKind::Moe) {
          EXPECT_EQ(bytes_of(layer_of(shards[1].weights).moe.router), bytes_of(layer.moe.router)) << what;
          for (size_t e = 0; e < layer.moe.experts.size(); ++e)
            expect_mlp_joins(shards, layer.moe.experts[e],
                             [&, e](const ModelWeights& w) -> const MlpWeights& { return layer_of(w).moe.experts[e]; },
                             what + " expert " + std::to_string(e));
        } else {
          expect_mlp_joins(
              shards, layer.mlp, [&](const ModelWeights& w) -> const MlpWeights& { return layer_of(w).mlp; }, what);
        }
      }
      EXPECT_EQ(bytes_of(shards[1].weights.lm_head), bytes_of(model.weights.lm_head));
      EXPECT_EQ(shards[1].config.mamba_d_inner * size, model.config.mamba_d_inner);
      ++num_checked;
    }
  EXPECT_EQ(num_checked, 12);  // every fixture over 2 ranks, 5 over 4 too
}

// Each shard of a described model against the same shard of the random model made on the host: the same views,
// each filled from the shard's recipe to the host shard's bytes, at distinct addresses (uploads are de-duplicated by
// address).
TEST(TensorParallel, ADescribedModelsShardsFillToTheHostShardsBytes) {
  int64_t num_checked = 0;
  for (const std::string& name : kFixtures)
    for (const int64_t size : {2, 4}) {
      const JambaConfig config = fixture(name).config;
      if (!tensor_parallel_obstacle(config, size).empty()) continue;
      const DType dtype = DType::BF16;
      const Model made = make_random_model(config, dtype, 7), described = describe_random_model(config, dtype, 7);
      for (int64_t rank = 0; rank < size; ++rank) {
        SCOPED_TRACE(name + ", rank " + std::to_string(rank) + " of " + std::to_string(size));
        const Model host = shard_model(made, rank, size), shard = shard_model(described, rank, size);
        ASSERT_FALSE(shard.has_host_data());
        const auto expected = model_test::all_tensors(host.weights), actual = model_test::all_tensors(shard.weights);
        ASSERT_EQ(expected.size(), actual.size());
        std::set<const void*> addresses;
        for (size_t i = 0; i < expected.size(); ++i) {
          const TensorView &want = *expected[i], &view = *actual[i];
          ASSERT_EQ(want.empty(), view.empty()) << want.name;
          if (want.empty()) continue;
          EXPECT_EQ(view.shape, want.shape) << want.name;
          if (&view != &shard.weights.lm_head || !config.tie_word_embeddings) {
            EXPECT_TRUE(addresses.insert(view.data).second) << want.name;
          }
          const RandomTensor& tensor = shard.random_recipe->tensor(view);
          std::vector<char> bytes(size_t(view.numel() * dtype_size(view.dtype)));
          RandomWeights::fill_host(tensor, bytes.data(), 0, tensor.numel);
          EXPECT_EQ(bytes, bytes_of(want)) << want.name;
        }
      }
      ++num_checked;
    }
  EXPECT_EQ(num_checked, 12);
}

// A shard of shapes only (what a memory plan counts) has the values shard's views, and copies nothing: a column
// slice keeps the address of the tensor it is cut from.
TEST(TensorParallel, AShardOfShapesOnlyHasTheViewsOfTheShardAndCopiesNothing) {
  const Model model = fixture("sharded-gqa4-bf16");
  const Model values = shard_model(model, 1, 2), shapes = shard_model(model, 1, 2, ShardContents::ShapesOnly);
  const auto expected = model_test::all_tensors(values.weights), actual = model_test::all_tensors(shapes.weights);
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i]->name, expected[i]->name);
    EXPECT_EQ(actual[i]->shape, expected[i]->shape) << expected[i]->name;
    EXPECT_EQ(actual[i]->dtype, expected[i]->dtype) << expected[i]->name;
    EXPECT_EQ(actual[i]->empty(), expected[i]->empty()) << expected[i]->name;
  }
  const MambaWeights &whole = model.weights.layers[0].mamba, &sliced = shapes.weights.layers[0].mamba;
  EXPECT_EQ(sliced.x_proj.data, whole.x_proj.data);
  EXPECT_EQ(sliced.in_proj.data, whole.in_proj.data);
  EXPECT_NE(values.weights.layers[0].mamba.x_proj.data, whole.x_proj.data);
}

TEST(TensorParallel, AModelThatCannotBeSplitSaysWhatDoesNotDivide) {
  const Model model = fixture("mqa-top2-tied-fp32");  // 6 heads, 1 KV head, I = 32
  EXPECT_EQ(tensor_parallel_obstacle(model.config, 2), "");
  EXPECT_EQ(tensor_parallel_obstacle(model.config, 3), "3 ranks do not divide the intermediate size 32");
  EXPECT_EQ(tensor_parallel_obstacle(model.config, 4), "4 ranks do not divide the 6 attention heads");
  const Model gqa = fixture("sharded-gqa4-bf16");  // 128 channels, I = 32, 8 heads, 2 KV heads
  EXPECT_EQ(tensor_parallel_obstacle(gqa.config, 8), "");
  EXPECT_EQ(tensor_parallel_obstacle(gqa.config, 16), "16 ranks do not divide the 8 attention heads");
  EXPECT_EQ(tensor_parallel_obstacle(gqa.config, 64), "64 ranks do not divide the intermediate size 32");
  try {
    shard_model(model, 0, 4);
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot shard the model: 4 ranks do not divide"), std::string::npos);
  }
}

}  // namespace
}  // namespace jambo::model
