// read_weight_update: a folder's tensors matched to the model's weights (all of them, a subset, fused expert names),
// and every way a folder can be wrong refused before anything is copied, naming the tensor or the field.
#include "model/weight_update.h"

#include "checkpoint_builder.h"
#include "core/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>

namespace jambo::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using model_test::ExpertLayout;
using model_test::TempFolder;
using model_test::TestTensor;
using model_test::TinyCheckpoint;

// The checkpoint's tensors (fp32) with every value halved: new weights of the same architecture.
std::vector<TestTensor> halved(const TinyCheckpoint& checkpoint) {
  std::vector<TestTensor> tensors = checkpoint.tensors();
  for (TestTensor& tensor : tensors)
    for (size_t b = 0; b < tensor.bytes.size(); b += 4) {
      float value;
      std::memcpy(&value, &tensor.bytes[b], 4);
      value /= 2;
      std::memcpy(&tensor.bytes[b], &value, 4);
    }
  return tensors;
}

struct Served {
  TempFolder folder;
  Model model;
};
std::unique_ptr<Served> serve(const TinyCheckpoint& checkpoint) {
  auto served = std::make_unique<Served>();
  checkpoint.write(served->folder.path());
  served->model = load_model(served->folder.path());
  return served;
}

std::string update_error(const std::filesystem::path& folder, const Model& model) {
  try {
    read_weight_update(folder, model);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// The model's views by name, as a walk over its weights names them.
std::map<std::string, const void*> targets_by_name(const Model& model) {
  std::map<std::string, const void*> out;
  for (const TensorView* view : model_test::all_tensors(model.weights))
    if (!view->empty()) out[view->name] = view->data;
  return out;
}

TEST(WeightUpdate, AFullFolderReplacesEveryWeight) {
  const TinyCheckpoint checkpoint;
  const auto served = serve(checkpoint);
  TempFolder update_folder;
  model_test::write_safetensors(update_folder / "model.safetensors", halved(checkpoint));
  model_test::write_text(update_folder / "config.json", checkpoint.config().dump());

  const WeightUpdate update = read_weight_update(update_folder.path(), served->model);
  EXPECT_EQ(update.num_bytes, served->model.weights.bytes_total);
  EXPECT_EQ(update.tensors.size(), checkpoint.tensors().size());
  const std::map<std::string, const void*> targets = targets_by_name(served->model);
  EXPECT_EQ(update.pieces.size(), targets.size());
  for (const WeightUpdate::Piece& piece : update.pieces) {
    SCOPED_TRACE(piece.name);
    ASSERT_TRUE(targets.contains(piece.name));
    EXPECT_EQ(piece.target.data, targets.at(piece.name));  // the model's own weight
    EXPECT_EQ(piece.source.shape, piece.target.shape);
    for (const int64_t i : {int64_t(0), piece.source.numel() - 1})
      EXPECT_EQ(piece.source.at(i), piece.target.at(i) / 2);
  }
}

// A folder of one fused expert tensor updates that layer's experts' gate and up rows, named per expert, and nothing
// else; no config.json is needed.
TEST(WeightUpdate, ASubsetUnderFusedNamesUpdatesItsWeightsAlone) {
  const auto served = serve(TinyCheckpoint{});
  TinyCheckpoint fused;
  fused.experts = ExpertLayout::Fused;
  const std::string name = "model.layers.3.feed_forward.experts.gate_up_proj";
  std::vector<TestTensor> tensors = halved(fused);
  std::erase_if(tensors, [&](const TestTensor& tensor) { return tensor.name != name; });
  ASSERT_EQ(tensors.size(), 1u);
  TempFolder update_folder;
  model_test::write_safetensors(update_folder / "model.safetensors", tensors);

  const WeightUpdate update = read_weight_update(update_folder.path(), served->model);
  EXPECT_EQ(update.tensors, std::vector<std::string>{name});
  ASSERT_EQ(update.pieces.size(), size_t(2 * model_test::kE));
  const MoeWeights& moe = served->model.weights.layers[3].moe;
  for (int64_t e = 0; e < model_test::kE; ++e) {
    const WeightUpdate::Piece& gate = update.pieces[size_t(2 * e)];
    const WeightUpdate::Piece& up = update.pieces[size_t(2 * e + 1)];
    EXPECT_EQ(gate.name, fmt::format("model.layers.3.feed_forward.experts.{}.gate_proj.weight", e));
    EXPECT_EQ(up.name, fmt::format("model.layers.3.feed_forward.experts.{}.up_proj.weight", e));
    EXPECT_EQ(gate.target.data, moe.experts[size_t(e)].gate_proj.data);
    EXPECT_EQ(up.target.data, moe.experts[size_t(e)].up_proj.data);
    EXPECT_EQ(gate.source.at(5), moe.experts[size_t(e)].gate_proj.at(5) / 2);
    EXPECT_EQ(up.source.at(7), moe.experts[size_t(e)].up_proj.at(7) / 2);
  }
  EXPECT_EQ(update.num_bytes, 2 * model_test::kE * model_test::kI * model_test::kH * 4);
}

// Every refusal names the folder's file and the tensor (or config field), and what was wrong.
TEST(WeightUpdate, ABadFolderIsRefusedNamingTheTensor) {
  const TinyCheckpoint checkpoint;
  const auto served = serve(checkpoint);
  const Model& model = served->model;
  const auto error_with = [&](const std::function<void(std::vector<TestTensor>&)>& edit) {
    TempFolder folder;
    std::vector<TestTensor> tensors = halved(checkpoint);
    edit(tensors);
    model_test::write_safetensors(folder / "model.safetensors", tensors);
    return update_error(folder.path(), model);
  };
  const auto set = [](std::vector<TestTensor>& tensors, const std::string& name, const auto& change) {
    for (TestTensor& tensor : tensors)
      if (tensor.name == name) change(tensor);
  };
  const std::string a_log = "model.layers.2.mamba.A_log";

  EXPECT_THAT(error_with([](auto& tensors) {
                tensors.push_back(model_test::make_tensor("extra.weight", DType::F32, {1}, {1.0f}));
              }),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("tensor 'extra.weight' is not one the model reads")));
  EXPECT_THAT(error_with([&](auto& tensors) {
                set(tensors, a_log, [](TestTensor& t) { t.shape = {model_test::kN, model_test::kDi}; });
              }),
              HasSubstr("tensor '" + a_log + "' has shape [4, 32], expected [32, 4]"));
  EXPECT_THAT(error_with([&](auto& tensors) {
                set(tensors, a_log, [](TestTensor& t) {
                  t = model_test::make_tensor(t.name, DType::BF16, t.shape,
                                              std::vector<float>(model_test::kDi * model_test::kN, 0.5f));
                });
              }),
              HasSubstr("tensor '" + a_log + "' is BF16, the serving model's is F32"));
  EXPECT_THAT(error_with([&](auto& tensors) {
                set(tensors, a_log, [](TestTensor& t) {
                  const float nan = std::numeric_limits<float>::quiet_NaN();
                  std::memcpy(&t.bytes[8], &nan, 4);
                });
              }),
              AllOf(HasSubstr(a_log), HasSubstr("NaN")));
  EXPECT_THAT(error_with([](auto& tensors) { tensors.clear(); }), HasSubstr("holds no tensors"));

  TinyCheckpoint fused;
  fused.experts = ExpertLayout::Fused;
  const std::string gate_up = "model.layers.0.feed_forward.experts.gate_up_proj";
  EXPECT_THAT(error_with([&](auto& tensors) {
                for (const TestTensor& tensor : halved(fused))
                  if (tensor.name == gate_up) tensors.push_back(tensor);
              }),
              AllOf(HasSubstr("holds both 'model.layers.0.feed_forward.experts.0.gate_proj.weight' and '" + gate_up),
                    HasSubstr("which give the same weight")));

  TempFolder other_architecture;
  nlohmann::json config = checkpoint.config();
  config["rms_norm_eps"] = 1e-5;
  model_test::write_text(other_architecture / "config.json", config.dump());
  model_test::write_safetensors(other_architecture / "model.safetensors", halved(checkpoint));
  EXPECT_THAT(update_error(other_architecture.path(), model),
              AllOf(HasSubstr("config.json: 'rms_norm_eps' is 1e-05"), HasSubstr("same architecture")));

  EXPECT_THAT(update_error(other_architecture / "missing", model), HasSubstr("missing"));
}

TEST(WeightUpdate, TiedEmbeddingsAreUpdatedThroughTheEmbedding) {
  TinyCheckpoint tied;
  tied.tied = true;
  const auto served = serve(tied);
  TempFolder folder;
  model_test::write_safetensors(
      folder / "model.safetensors",
      {model_test::make_tensor("lm_head.weight", DType::F32, {model_test::kV, model_test::kH},
                               model_test::test_values("lm_head.weight", model_test::kV * model_test::kH))});
  EXPECT_THAT(update_error(folder.path(), served->model),
              AllOf(HasSubstr("'lm_head.weight' is not one the model reads"), HasSubstr("update model.embed_tokens")));
}

}  // namespace
}  // namespace jambo::model
