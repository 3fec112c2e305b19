// Checkpoint: reading safetensors files and shards, dtype conversions, and every header error.
#include "checkpoint_builder.h"
#include "core/error.h"
#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <limits>

namespace jambo::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using model_test::make_tensor;
using model_test::TempFolder;
using model_test::TestTensor;
using nlohmann::json;

std::string open_error(const TempFolder& folder) {
  try {
    Checkpoint::open(folder.path());
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

std::vector<TestTensor> two_tensors() {
  return {make_tensor("a.weight", DType::F32, {2, 2}, {1, 2, 3, 4}),
          make_tensor("b.weight", DType::F32, {4}, {5, 6, 7, 8})};
}

// Writes model.safetensors with the given header (as JSON) over the data of two_tensors().
void write_with_header(const TempFolder& folder, const json& header) {
  model_test::write_file(folder / "model.safetensors", header.dump(), model_test::data_for(two_tensors()));
}

TEST(Safetensors, ReadsEachDtype) {
  TempFolder folder;
  const std::vector<float> values = {1.5f, -2.25f, 0.0f, 1024.0f, -0.0625f, 3.0f};
  model_test::write_safetensors(folder / "model.safetensors",
                                {make_tensor("x.f32", DType::F32, {2, 3}, values),
                                 make_tensor("x.bf16", DType::BF16, {3, 2}, values),
                                 make_tensor("x.f16", DType::F16, {6}, values)});
  const Checkpoint checkpoint = Checkpoint::open(folder.path());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"x.bf16", "x.f16", "x.f32"}));
  EXPECT_EQ(checkpoint.find("x.bf16")->dtype, DType::BF16);
  EXPECT_EQ(checkpoint.find("x.f16")->dtype, DType::F16);
  EXPECT_EQ(checkpoint.find("missing"), nullptr);
  for (const char* name : {"x.f32", "x.bf16", "x.f16"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(model_test::values_of(*checkpoint.find(name)), values);
  }
  EXPECT_EQ(checkpoint.get("x.f32", {2, 3}).name, "x.f32");
}

TEST(Safetensors, HalfPrecisionBitPatternsConvertExactly) {
  TempFolder folder;
  const std::vector<uint16_t> f16_bits = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x3555, 0x7c00, 0x8000};
  const std::vector<float> f16_values = {1.0f, -2.0f, 0x1p-24f, 1023 * 0x1p-24f, 65504.0f,
                                         0.333251953125f, std::numeric_limits<float>::infinity(), -0.0f};
  const std::vector<uint16_t> bf16_bits = {0x3f80, 0x4049, 0xc2f7, 0x0001, 0xff80};
  const std::vector<float> bf16_values = {1.0f, 3.140625f, -123.5f, 0x1p-133f,
                                          -std::numeric_limits<float>::infinity()};
  auto raw = [](std::string name, std::string dtype, const std::vector<uint16_t>& bits) {
    TestTensor tensor{std::move(name), std::move(dtype), {int64_t(bits.size())}, {}};
    for (uint16_t word : bits) tensor.bytes.insert(tensor.bytes.end(), {uint8_t(word), uint8_t(word >> 8)});
    return tensor;
  };
  model_test::write_safetensors(folder / "model.safetensors",
                                {raw("h", "F16", f16_bits), raw("b", "BF16", bf16_bits)});
  const Checkpoint checkpoint = Checkpoint::open(folder.path());
  EXPECT_EQ(model_test::values_of(*checkpoint.find("h")), f16_values);
  EXPECT_TRUE(std::signbit(checkpoint.find("h")->at(7)));
  EXPECT_EQ(model_test::values_of(*checkpoint.find("b")), bf16_values);
}

TEST(Safetensors, MisalignedDataIsReadCorrectly) {
  TempFolder folder;
  // A header of 8k+1 bytes puts the F32 data at an odd address in the map.
  std::string header = model_test::header_for(two_tensors()).dump();
  header.append(8 - header.size() % 8 + 1, ' ');
  model_test::write_file(folder / "model.safetensors", header, model_test::data_for(two_tensors()));
  const Checkpoint checkpoint = Checkpoint::open(folder.path());
  const TensorView b = checkpoint.get("b.weight", {4});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 4, 0u);
  EXPECT_EQ(model_test::values_of(b), (std::vector<float>{5, 6, 7, 8}));
}

TEST(Safetensors, WrongShapeAndMissingTensorAreNamed) {
  TempFolder folder;
  model_test::write_safetensors(folder / "model.safetensors",
                                {make_tensor("model.layers.3.mamba.A_log", DType::F32, {64, 16},
                                             std::vector<float>(64 * 16, 0.5f))});
  const Checkpoint checkpoint = Checkpoint::open(folder.path());
  EXPECT_THAT([&] { checkpoint.get("model.layers.3.mamba.A_log", {128, 16}); },
              ::testing::ThrowsMessage<Error>(HasSubstr(
                  "model.safetensors: tensor 'model.layers.3.mamba.A_log' has shape [64, 16], expected [128, 16]")));
  EXPECT_THAT([&] { checkpoint.get("model.layers.3.mamba.D", {128}); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("model.safetensors"), HasSubstr("'model.layers.3.mamba.D' not found"))));
}

TEST(Safetensors, HeaderErrorsNameFileAndTensor) {
  TempFolder folder;
  const json good = model_test::header_for(two_tensors());  // a: [0, 16], b: [16, 32]
  struct Case {
    std::string what;
    json header;
    std::string expected;
  };
  std::vector<Case> cases;
  auto with = [&](const char* what, const char* tensor, const char* field, json value, std::string expected) {
    json header = good;
    header[tensor][field] = std::move(value);
    cases.push_back({what, header, std::move(expected)});
  };
  with("unknown dtype", "b.weight", "dtype", "I8", "tensor 'b.weight' has dtype I8");
  with("range past the data", "b.weight", "data_offsets", {16, 48}, "tensor 'b.weight' has data_offsets [16, 48] beyond the end");
  with("overlapping ranges", "b.weight", "data_offsets", {8, 24}, "tensors 'a.weight' [0, 16] and 'b.weight' [8, 24] have overlapping");
  with("begin after end", "b.weight", "data_offsets", {24, 16}, "tensor 'b.weight' has data_offsets [24, 16] with begin after end");
  with("size mismatch", "b.weight", "shape", {5}, "tensor 'b.weight' of shape [5] and dtype F32 needs 20 bytes");
  with("huge shape", "b.weight", "shape", {int64_t(1) << 40, int64_t(1) << 20}, "tensor 'b.weight' of shape");
  with("negative extent", "a.weight", "shape", {-2, 2}, "tensor 'a.weight' has 'shape' = [-2,2]");
  with("one offset", "a.weight", "data_offsets", {0}, "tensor 'a.weight' has data_offsets [0]");
  with("dtype not a string", "a.weight", "dtype", 4, "tensor 'a.weight' has no string 'dtype'");
  with("shape not a list", "a.weight", "shape", "2x2", "tensor 'a.weight' has no list 'shape'");
  for (const Case& test : cases) {
    SCOPED_TRACE(test.what);
    write_with_header(folder, test.header);
    EXPECT_THAT(open_error(folder), AllOf(HasSubstr("model.safetensors: "), HasSubstr(test.expected)));
  }
}

TEST(Safetensors, BrokenFilesAreRejected) {
  TempFolder folder;
  const std::string header = model_test::header_for(two_tensors()).dump();
  const std::vector<uint8_t> data = model_test::data_for(two_tensors());
  model_test::write_file(folder / "model.safetensors", header, data, uint64_t(1) << 40);
  EXPECT_THAT(open_error(folder), AllOf(HasSubstr("model.safetensors: header length 1099511627776 exceeds the file size")));
  model_test::write_file(folder / "model.safetensors", "{\"a.weight\": {\"dtype\": ", data);
  EXPECT_THAT(open_error(folder), AllOf(HasSubstr("model.safetensors: header: malformed JSON"), HasSubstr("column")));
  model_test::write_file(folder / "model.safetensors", "[]", data);
  EXPECT_THAT(open_error(folder), HasSubstr("model.safetensors: the header is not a JSON object"));
  model_test::write_text(folder / "model.safetensors", "abc");
  EXPECT_THAT(open_error(folder), HasSubstr("model.safetensors: 3 bytes is too small"));
  // Truncated after a valid header: the last tensor's range runs past the end.
  model_test::write_file(folder / "model.safetensors", header, std::vector<uint8_t>(data.begin(), data.end() - 3));
  EXPECT_THAT(open_error(folder), HasSubstr("tensor 'b.weight' has data_offsets [16, 32] beyond the end of the data (29 bytes)"));
}

TEST(Safetensors, FolderWithoutCheckpointIsNamed) {
  TempFolder folder;
  EXPECT_THAT(open_error(folder), AllOf(HasSubstr(folder.path().string()), HasSubstr("no model.safetensors")));
  EXPECT_THAT([&] { Checkpoint::open(folder / "absent"); },
              ::testing::ThrowsMessage<Error>(HasSubstr((folder / "absent").string() + ": model folder not found")));
}

// Shards: a.weight in shard 1, b.weight in shard 2.
void write_shards(const TempFolder& folder, const json& weight_map) {
  const std::vector<TestTensor> tensors = two_tensors();
  model_test::write_safetensors(folder / "model-00001-of-00002.safetensors", {tensors[0]});
  model_test::write_safetensors(folder / "model-00002-of-00002.safetensors", {tensors[1]});
  model_test::write_text(folder / "model.safetensors.index.json",
                         json{{"metadata", {{"total_size", 32}}}, {"weight_map", weight_map}}.dump());
}

const json kGoodWeightMap = {{"a.weight", "model-00001-of-00002.safetensors"},
                             {"b.weight", "model-00002-of-00002.safetensors"}};

TEST(Safetensors, ShardedCheckpointFollowsTheIndex) {
  TempFolder folder;
  write_shards(folder, kGoodWeightMap);
  const Checkpoint checkpoint = Checkpoint::open(folder.path());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a.weight", "b.weight"}));
  EXPECT_EQ(model_test::values_of(checkpoint.get("a.weight", {2, 2})), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(model_test::values_of(checkpoint.get("b.weight", {4})), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_THAT([&] { checkpoint.get("b.weight", {2, 2}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("model-00002-of-00002.safetensors: tensor 'b.weight' has shape [4]")));
  EXPECT_THAT([&] { checkpoint.get("c.weight", {2}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("model.safetensors.index.json: tensor 'c.weight' not found")));
}

TEST(Safetensors, ShardErrorsNameIndexShardAndTensor) {
  TempFolder folder;
  json missing_shard = kGoodWeightMap;
  missing_shard["b.weight"] = "model-00003-of-00002.safetensors";
  write_shards(folder, missing_shard);
  EXPECT_THAT(open_error(folder), AllOf(HasSubstr("model.safetensors.index.json: shard 'model-00003-of-00002.safetensors'"),
                                        HasSubstr("'b.weight'"), HasSubstr("not found")));
  json wrong_shard = kGoodWeightMap;
  wrong_shard["b.weight"] = "model-00001-of-00002.safetensors";
  write_shards(folder, wrong_shard);
  EXPECT_THAT(open_error(folder), HasSubstr("tensor 'b.weight' is mapped to 'model-00001-of-00002.safetensors', which does not contain it"));
  model_test::write_text(folder / "model.safetensors.index.json", "{\"weight_map\": {");
  EXPECT_THAT(open_error(folder), AllOf(HasSubstr("model.safetensors.index.json: malformed JSON")));
  model_test::write_text(folder / "model.safetensors.index.json", "{\"weight_map\": {\"a.weight\": 3}}");
  EXPECT_THAT(open_error(folder), HasSubstr("'weight_map' entry 'a.weight' = 3 is not a file name"));
  // A name too long for the file system to look at is not found, not the library's exception (found by the fuzzer).
  json long_name = kGoodWeightMap;
  long_name["b.weight"] = std::string(5000, 'x') + ".safetensors";
  write_shards(folder, long_name);
  EXPECT_THAT(open_error(folder), AllOf(HasSubstr("(holding tensor 'b.weight') not found"), HasSubstr("xxxx")));
}

TEST(Safetensors, ShardsAreFileNamesInTheModelFolder) {
  TempFolder folder;
  for (const std::string& shard : std::vector<std::string>{"../../../etc/passwd", "/etc/passwd", "sub/model.safetensors",
                                                          "..", ".", "",
                                                          std::string("model-00002-of-00002.safetensors\0x", 34)}) {
    SCOPED_TRACE(shard);
    json weight_map = kGoodWeightMap;
    weight_map["b.weight"] = shard;
    write_shards(folder, weight_map);
    EXPECT_THAT(open_error(folder),
                AllOf(HasSubstr("model.safetensors.index.json: 'weight_map' entry 'b.weight' = "),
                      HasSubstr("is not a plain file name in the model folder")));
  }
}

// Opening a FIFO for reading waits for a writer: it must be refused, not opened.
TEST(Safetensors, AShardThatIsNotARegularFileIsRefused) {
  TempFolder folder;
  ASSERT_EQ(mkfifo((folder / "model.safetensors").c_str(), 0600), 0);
  std::future<std::string> opened = std::async(std::launch::async, [&] { return open_error(folder); });
  if (opened.wait_for(std::chrono::seconds(20)) == std::future_status::timeout) {
    ADD_FAILURE() << "open() waits for a writer of the FIFO";
    std::ofstream(folder / "model.safetensors").close();  // be that writer, so that the test ends
  }
  EXPECT_THAT(opened.get(), HasSubstr("model.safetensors: not a regular file"));
  std::filesystem::remove(folder / "model.safetensors");
  std::filesystem::create_directory(folder / "model.safetensors");
  EXPECT_THAT(open_error(folder), HasSubstr("model.safetensors: not a regular file"));
}

}  // namespace
}  // namespace jambo::model
