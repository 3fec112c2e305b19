// Weights holding NaN or infinity are refused at load, naming the file, the tensor and the first bad index, in every
// stored dtype and wherever the value sits; the largest finite values and subnormals still load.
#include "checkpoint_builder.h"
#include "core/error.h"
#include "model/finite_values.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace jambo::model {
namespace {

using ::testing::HasSubstr;
using model_test::ExpertLayout;
using model_test::TempFolder;
using model_test::TestTensor;
using model_test::TinyCheckpoint;

// One value's bits in each stored dtype, and how the loader's message writes it.
struct SpecialValue {
  const char* shown;
  uint32_t f32;
  uint16_t bf16;
  uint16_t f16;
};

constexpr SpecialValue kNan{"NaN", 0x7fc00000u, 0x7fc0, 0x7e00};
constexpr SpecialValue kInf{"inf", 0x7f800000u, 0x7f80, 0x7c00};
constexpr SpecialValue kNegativeInf{"-inf", 0xff800000u, 0xff80, 0xfc00};
constexpr SpecialValue kNegativeNanSmallestPayload{"NaN", 0xff800001u, 0xff81, 0xfc01};

uint32_t bits_in(DType dtype, const SpecialValue& value) {
  return dtype == DType::F32 ? value.f32 : dtype == DType::BF16 ? value.bf16 : value.f16;
}

// Sets element `index` of the named tensor to these bits (little-endian, the tensor's element size).
void set_element(std::vector<TestTensor>& tensors, const std::string& name, int64_t index, uint32_t bits) {
  for (TestTensor& tensor : tensors) {
    if (tensor.name != name) continue;
    const int64_t size = tensor.dtype == "F32" ? 4 : 2;
    for (int64_t b = 0; b < size; ++b) tensor.bytes.at(size_t(index * size + b)) = uint8_t(bits >> (8 * b));
    return;
  }
  FAIL() << "no tensor " << name;
}

size_t numel_of(const std::vector<TestTensor>& tensors, const std::string& name) {
  for (const TestTensor& tensor : tensors)
    if (tensor.name == name) return tensor.bytes.size() / (tensor.dtype == "F32" ? 4 : 2);
  return 0;
}

void write_checkpoint(const std::filesystem::path& folder, const TinyCheckpoint& checkpoint,
                      const std::vector<TestTensor>& tensors) {
  model_test::write_text(folder / "config.json", checkpoint.config().dump());
  model_test::write_safetensors(folder / "model.safetensors", tensors);
}

std::string load_error(const std::filesystem::path& folder) {
  try {
    load_model(folder);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// A tensor and an element of it, with where the message places that element.
struct Placement {
  std::string tensor;
  int64_t index;
  std::string position;  // "" for a vector
};

// First, last and middle elements; a matrix, a vector and the 3-D conv kernel.
const std::vector<Placement> kPlacements = {
    {"model.embed_tokens.weight", 0, " (row 0, column 0)"},
    {"lm_head.weight", model_test::kV * model_test::kH - 1, " (row 31, column 15)"},
    {"model.layers.2.input_layernorm.weight", 7, ""},
    {"model.layers.1.feed_forward.down_proj.weight", 200, " (row 8, column 8)"},
    {"model.layers.0.mamba.conv1d.weight", 50, " (element [16, 0, 2])"},
    {"model.final_layernorm.weight", model_test::kH - 1, ""},
};

class EachStoredDtype : public ::testing::TestWithParam<DType> {};

TEST_P(EachStoredDtype, NanAndInfinitiesAnywhereAreRefusedNamingTensorAndFirstIndex) {
  const DType dtype = GetParam();
  TinyCheckpoint checkpoint;
  checkpoint.dtype = dtype;
  for (const SpecialValue& value : {kNan, kInf, kNegativeInf, kNegativeNanSmallestPayload})
    for (const Placement& placement : kPlacements) {
      SCOPED_TRACE(fmt::format("{} at {} of {}", value.shown, placement.index, placement.tensor));
      TempFolder folder;
      std::vector<TestTensor> tensors = checkpoint.tensors();
      set_element(tensors, placement.tensor, placement.index, bits_in(dtype, value));
      // A second bad value further on in the tensor, where there is room: the message names the first.
      if (placement.index + 1 < int64_t(numel_of(tensors, placement.tensor)))
        set_element(tensors, placement.tensor, placement.index + 1, bits_in(dtype, kNan));
      write_checkpoint(folder.path(), checkpoint, tensors);
      const std::string expected =
          fmt::format("{}: tensor '{}' holds {} at index {}{}", (folder / "model.safetensors").string(),
                      placement.tensor, value.shown, placement.index, placement.position);
      EXPECT_EQ(load_error(folder.path()), expected);
    }
}

TEST_P(EachStoredDtype, LargestFiniteValuesAndSubnormalsLoad) {
  const DType dtype = GetParam();
  TinyCheckpoint checkpoint;
  checkpoint.dtype = dtype;
  std::vector<TestTensor> tensors = checkpoint.tensors();
  const uint32_t largest = dtype == DType::F32 ? 0x7f7fffffu : dtype == DType::BF16 ? 0x7f7fu : 0x7bffu;
  const uint32_t sign = dtype == DType::F32 ? 0x80000000u : 0x8000u;
  set_element(tensors, "lm_head.weight", 0, largest);
  set_element(tensors, "lm_head.weight", 1, largest | sign);
  set_element(tensors, "lm_head.weight", 2, 1);  // the smallest subnormal
  TempFolder folder;
  write_checkpoint(folder.path(), checkpoint, tensors);
  const Model model = load_model(folder.path());
  EXPECT_GT(model.weights.lm_head.at(2), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(NonFiniteWeights, EachStoredDtype, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The index is the stacked tensor's, as it is on disk: expert 2, row 30 (an up_proj row), column 5.
TEST(NonFiniteWeights, AFusedExpertIsNamedByItsStackedTensor) {
  TinyCheckpoint checkpoint;
  checkpoint.experts = ExpertLayout::Fused;
  const std::string name = "model.layers.3.feed_forward.experts.gate_up_proj";
  const int64_t index = (2 * 2 * model_test::kI + 30) * model_test::kH + 5;
  std::vector<TestTensor> tensors = checkpoint.tensors();
  set_element(tensors, name, index, kInf.f32);
  TempFolder folder;
  write_checkpoint(folder.path(), checkpoint, tensors);
  EXPECT_EQ(load_error(folder.path()), fmt::format("{}: tensor '{}' holds inf at index {} (element [2, 30, 5])",
                                                   (folder / "model.safetensors").string(), name, index));
}

TEST(NonFiniteWeights, AShardIsNamedByItsFile) {
  TinyCheckpoint checkpoint;
  std::vector<TestTensor> tensors = checkpoint.tensors();
  set_element(tensors, "model.final_layernorm.weight", 3, kNegativeInf.f32);
  const size_t half = tensors.size() / 2;
  nlohmann::json weight_map;
  for (size_t i = 0; i < tensors.size(); ++i)
    weight_map[tensors[i].name] = i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  TempFolder folder;
  model_test::write_safetensors(folder / "model-00001-of-00002.safetensors", {tensors.begin(), tensors.begin() + half});
  model_test::write_safetensors(folder / "model-00002-of-00002.safetensors", {tensors.begin() + half, tensors.end()});
  model_test::write_text(folder / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  model_test::write_text(folder / "config.json", checkpoint.config().dump());
  EXPECT_EQ(load_error(folder.path()),
            fmt::format("{}: tensor 'model.final_layernorm.weight' holds -inf at index 3",
                        (folder / "model-00002-of-00002.safetensors").string()));
}

TEST(NonFiniteWeights, TiedEmbeddingsAreCheckedAsTheEmbedding) {
  TinyCheckpoint checkpoint;
  checkpoint.tied = true;
  std::vector<TestTensor> tensors = checkpoint.tensors();
  set_element(tensors, "model.embed_tokens.weight", 17, kNan.f32);
  TempFolder folder;
  write_checkpoint(folder.path(), checkpoint, tensors);
  EXPECT_THAT(load_error(folder.path()),
              HasSubstr("tensor 'model.embed_tokens.weight' holds NaN at index 17 (row 1, column 1)"));
}

// Of two bad tensors the message names the one loaded first (the embedding), not the first by name (lm_head).
TEST(NonFiniteWeights, TheFirstBadTensorInLoadOrderIsNamed) {
  TinyCheckpoint checkpoint;
  std::vector<TestTensor> tensors = checkpoint.tensors();
  set_element(tensors, "lm_head.weight", 0, kNan.f32);
  set_element(tensors, "model.embed_tokens.weight", 100, kInf.f32);
  TempFolder folder;
  write_checkpoint(folder.path(), checkpoint, tensors);
  EXPECT_THAT(load_error(folder.path()),
              HasSubstr("tensor 'model.embed_tokens.weight' holds inf at index 100 (row 6, column 4)"));
}

// Only the tensors the model reads are scanned: one it does not use is reported as unused, not read.
TEST(NonFiniteWeights, AnUnusedTensorIsNotRead) {
  TinyCheckpoint checkpoint;
  std::vector<TestTensor> tensors = checkpoint.tensors();
  tensors.push_back(model_test::make_tensor("extra.weight", DType::F32, {2}, {1.0f, 1.0f}));
  set_element(tensors, "extra.weight", 1, kNan.f32);
  TempFolder folder;
  write_checkpoint(folder.path(), checkpoint, tensors);
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(load_model(folder.path()));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("1 tensors are not used by the model: extra.weight"));
}

// Views longer than one thread's share of work: the first bad element in the views' order is found wherever the
// shares split, in every dtype.
TEST(FindNonFinite, FindsTheFirstInViewOrderAcrossThreadShares) {
  constexpr int64_t kShare = int64_t(1) << 16;
  constexpr int64_t kCount = 5 * kShare + 3;
  std::vector<float> f32(kCount, 1.0f);
  std::vector<uint16_t> bf16(kCount, 0x3f80), f16(kCount, 0x3c00);
  const std::vector<TensorView> views = {{f32.data(), DType::F32, {kCount}, "f32"},
                                         {bf16.data(), DType::BF16, {kCount}, "bf16"},
                                         {f16.data(), DType::F16, {kCount}, "f16"}};
  EXPECT_FALSE(find_nonfinite(views));
  f16[2 * kShare + 77] = 0x7c01;  // a NaN
  std::optional<NonFiniteValue> found = find_nonfinite(views);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->view, 2u);
  EXPECT_EQ(found->index, 2 * kShare + 77);
  EXPECT_TRUE(std::isnan(found->value));
  bf16[3 * kShare + 9] = 0x7fc1;
  bf16[3 * kShare] = 0xff80;
  found = find_nonfinite(views);
  EXPECT_EQ(found->view, 1u);
  EXPECT_EQ(found->index, 3 * kShare);
  EXPECT_EQ(found->value, -INFINITY);
  f32.back() = -INFINITY;
  EXPECT_EQ(find_nonfinite(views)->index, kCount - 1);
  f32[4 * kShare + 1] = NAN;
  f32[kShare - 1] = INFINITY;  // the last element of the first share
  found = find_nonfinite(views);
  EXPECT_EQ(found->view, 0u);
  EXPECT_EQ(found->index, kShare - 1);
  EXPECT_EQ(found->value, INFINITY);
}

}  // namespace
}  // namespace jambo::model
