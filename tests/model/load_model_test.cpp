// load_model: tiny checkpoints in every layout and dtype against the values written, and the
// errors and warnings of a checkpoint that does not fit its config.
#include "checkpoint_builder.h"
#include "core/error.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace jambo::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using model_test::ExpertLayout;
using model_test::TempFolder;
using model_test::TestTensor;
using model_test::TinyCheckpoint;

std::string load_error(const std::filesystem::path& folder) {
  try {
    load_model(folder);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// Writes the checkpoint with `edit` applied to its tensor list.
template <typename Edit>
void write_edited(const TempFolder& folder, const TinyCheckpoint& checkpoint, Edit edit) {
  std::vector<TestTensor> tensors = checkpoint.tensors();
  edit(tensors);
  model_test::write_text(folder / "config.json", checkpoint.config().dump());
  model_test::write_safetensors(folder / "model.safetensors", tensors);
}

void expect_same_values(const Model& a, const Model& b) {
  const auto left = model_test::all_tensors(a.weights), right = model_test::all_tensors(b.weights);
  ASSERT_EQ(left.size(), right.size());
  for (size_t i = 0; i < left.size(); ++i) {
    SCOPED_TRACE(left[i]->name);
    EXPECT_EQ(left[i]->shape, right[i]->shape);
    EXPECT_EQ(model_test::values_of(*left[i]), model_test::values_of(*right[i]));
  }
}

class EachDtype : public ::testing::TestWithParam<DType> {};

TEST_P(EachDtype, EveryTensorLandsInItsFieldWithItsValues) {
  TempFolder folder;
  TinyCheckpoint checkpoint;
  checkpoint.dtype = GetParam();
  checkpoint.write(folder.path());
  const Model model = load_model(folder.path());

  std::map<std::string, const TensorView*> loaded;
  for (const TensorView* view : model_test::all_tensors(model.weights))
    if (!view->empty()) loaded[view->name] = view;
  const std::vector<TestTensor> written = checkpoint.tensors();
  EXPECT_EQ(loaded.size(), written.size());
  int64_t total_bytes = 0;
  for (const TestTensor& tensor : written) {
    SCOPED_TRACE(tensor.name);
    ASSERT_TRUE(loaded.contains(tensor.name));
    const TensorView& view = *loaded[tensor.name];
    EXPECT_EQ(view.dtype, GetParam());
    EXPECT_EQ(view.shape, tensor.shape);
    EXPECT_EQ(model_test::values_of(view), model_test::test_values(tensor.name, view.numel()));
    total_bytes += int64_t(tensor.bytes.size());
  }
  EXPECT_EQ(model.weights.bytes_total, total_bytes);
  // Spot checks that names went to the right fields.
  EXPECT_EQ(model.weights.layers[3].moe.experts[2].up_proj.name, "model.layers.3.feed_forward.experts.2.up_proj.weight");
  EXPECT_EQ(model.weights.layers[2].mamba.A_log.name, "model.layers.2.mamba.A_log");
  EXPECT_EQ(model.weights.layers[1].attention.k_proj.name, "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(model.weights.lm_head.name, "lm_head.weight");
}

INSTANTIATE_TEST_SUITE_P(LoadModel, EachDtype, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LoadModel, FusedExpertsEqualPerExpertNames) {
  TempFolder per_expert_folder;
  TinyCheckpoint per_expert;
  per_expert.dtype = DType::BF16;
  per_expert.write(per_expert_folder.path());
  TempFolder fused_folder;
  TinyCheckpoint fused = per_expert;
  fused.experts = ExpertLayout::Fused;
  fused.write(fused_folder.path());
  const Model a = load_model(per_expert_folder.path());
  const Model b = load_model(fused_folder.path());
  expect_same_values(a, b);
  EXPECT_EQ(a.weights.bytes_total, b.weights.bytes_total);
}

TEST(LoadModel, ShardedEqualsSingleFile) {
  TempFolder single_folder, sharded_folder;
  TinyCheckpoint checkpoint;
  checkpoint.write(single_folder.path());
  const std::vector<TestTensor> tensors = checkpoint.tensors();
  const size_t half = tensors.size() / 2;
  nlohmann::json weight_map;
  for (size_t i = 0; i < tensors.size(); ++i)
    weight_map[tensors[i].name] = i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  model_test::write_safetensors(sharded_folder / "model-00001-of-00002.safetensors", {tensors.begin(), tensors.begin() + half});
  model_test::write_safetensors(sharded_folder / "model-00002-of-00002.safetensors", {tensors.begin() + half, tensors.end()});
  model_test::write_text(sharded_folder / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  model_test::write_text(sharded_folder / "config.json", checkpoint.config().dump());
  expect_same_values(load_model(single_folder.path()), load_model(sharded_folder.path()));
}

TEST(LoadModel, TiedEmbeddingsShareTheEmbedding) {
  TempFolder folder;
  TinyCheckpoint checkpoint;
  checkpoint.tied = true;
  checkpoint.write(folder.path());
  const Model model = load_model(folder.path());
  EXPECT_EQ(model.weights.lm_head.data, model.weights.embed_tokens.data);
  int64_t total_bytes = 0;
  for (const TestTensor& tensor : checkpoint.tensors()) total_bytes += int64_t(tensor.bytes.size());
  EXPECT_EQ(model.weights.bytes_total, total_bytes);  // the embedding counted once
}

TEST(LoadModel, UntiedWithoutLmHeadIsAnError) {
  TempFolder folder;
  TinyCheckpoint tied;
  tied.tied = true;
  model_test::write_safetensors(folder / "model.safetensors", tied.tensors());
  model_test::write_text(folder / "config.json", TinyCheckpoint().config().dump());
  EXPECT_THAT(load_error(folder.path()), AllOf(HasSubstr("model.safetensors"), HasSubstr("'lm_head.weight' not found")));
}

TEST(LoadModel, MissingOrMisshapenTensorIsNamed) {
  TempFolder folder;
  const std::string name = "model.layers.2.mamba.A_log";
  write_edited(folder, TinyCheckpoint(), [&](std::vector<TestTensor>& tensors) {
    std::erase_if(tensors, [&](const TestTensor& t) { return t.name == name; });
  });
  EXPECT_THAT(load_error(folder.path()), AllOf(HasSubstr("model.safetensors: tensor '" + name + "' not found")));
  write_edited(folder, TinyCheckpoint(), [&](std::vector<TestTensor>& tensors) {
    for (TestTensor& t : tensors)
      if (t.name == name) t.shape = {model_test::kN, model_test::kDi};
  });
  EXPECT_THAT(load_error(folder.path()), HasSubstr("model.safetensors: tensor '" + name + "' has shape [4, 32], expected [32, 4]"));
}

TEST(LoadModel, UnusedTensorsAreReportedOnce) {
  TempFolder folder;
  write_edited(folder, TinyCheckpoint(), [](std::vector<TestTensor>& tensors) {
    for (int i = 0; i < 7; ++i)
      tensors.push_back(model_test::make_tensor("extra." + std::to_string(i), DType::F32, {1}, {1.0f}));
  });
  ::testing::internal::CaptureStderr();
  load_model(folder.path());
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(warning, AllOf(HasSubstr("warning: "), HasSubstr("model.safetensors: 7 tensors are not used"),
                             HasSubstr("extra.0, extra.1"), HasSubstr(", ...")));
  EXPECT_EQ(std::count(warning.begin(), warning.end(), '\n'), 1);
}

TEST(LoadModel, BiasSwitchesDecideWhichBiasesAreRead) {
  TempFolder folder;
  TinyCheckpoint checkpoint;
  nlohmann::json config = checkpoint.config();
  config["mamba_proj_bias"] = false;
  config["mamba_conv_bias"] = false;
  write_edited(folder, checkpoint, [](std::vector<TestTensor>& tensors) {
    std::erase_if(tensors, [](const TestTensor& t) { return t.name.ends_with("conv1d.bias"); });
  });
  model_test::write_text(folder / "config.json", config.dump());
  ::testing::internal::CaptureStderr();
  const Model model = load_model(folder.path());
  const std::string warning = ::testing::internal::GetCapturedStderr();
  const MambaWeights& mamba = model.weights.layers[0].mamba;
  EXPECT_TRUE(mamba.in_proj_bias.empty());
  EXPECT_TRUE(mamba.out_proj_bias.empty());
  EXPECT_TRUE(mamba.conv_bias.empty());
  EXPECT_THAT(warning, AllOf(HasSubstr("4 tensors are not used"), HasSubstr("model.layers.0.mamba.in_proj.bias")));
}

TEST(LoadModel, FolderProblemsNameThePath) {
  TempFolder folder;
  EXPECT_THAT(load_error(folder / "absent"), HasSubstr((folder / "absent").string() + ": model folder not found"));
  EXPECT_THAT(load_error(folder.path()), HasSubstr((folder / "config.json").string() + ": file not found"));
  model_test::write_text(folder / "config.json", TinyCheckpoint().config().dump());
  EXPECT_THAT(load_error(folder.path()), AllOf(HasSubstr(folder.path().string()), HasSubstr("no model.safetensors")));
  // The config.json of a folder given for the folder: the message says it is a file, not that nothing is there.
  const std::string config_path = (folder / "config.json").string();
  EXPECT_THAT(load_error(config_path),
              HasSubstr(fmt::format("'{}' is a file; give the model folder that holds it", config_path)));
  nlohmann::json bad = TinyCheckpoint().config();
  bad["attn_layer_offset"] = 2;
  model_test::write_text(folder / "config.json", bad.dump());
  EXPECT_THAT(load_error(folder.path()), AllOf(HasSubstr("config.json"), HasSubstr("'attn_layer_offset' = 2")));
}

}  // namespace
}  // namespace jambo::model
