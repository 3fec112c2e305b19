// Every checkpoint under tests/fixtures/models/ (made by tools/ with Hugging Face transformers)
// loads: the real on-disk layouts, as transformers saves them. A fixture folder holds its
// checkpoint, or names it in reference.json's "model_dir" (relative to the repository root).
#include "core/error.h"
#include "model/weights.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace jambo::model {
namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = JAMBO_SOURCE_DIR;

fs::path checkpoint_folder(const fs::path& fixture) {
  const fs::path reference = fixture / "reference.json";
  if (!fs::exists(reference)) return fixture;
  const nlohmann::json info = nlohmann::json::parse(std::ifstream(reference));
  return info.contains("model_dir") ? kSourceDir / info.at("model_dir").get<std::string>() : fixture;
}

// Bytes after the headers of all safetensors files in a folder: every tensor's data, once.
int64_t data_bytes_on_disk(const fs::path& folder) {
  int64_t total = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream file(entry.path(), std::ios::binary);
    uint64_t header_length = 0;
    for (int i = 0; i < 8; ++i) header_length |= uint64_t(uint8_t(file.get())) << (8 * i);
    total += int64_t(entry.file_size()) - 8 - int64_t(header_length);
  }
  return total;
}

TEST(FixtureModels, EveryFixtureCheckpointLoads) {
  const fs::path root = kSourceDir / "tests" / "fixtures" / "models";
  if (!fs::exists(root)) GTEST_SKIP() << root << " does not exist yet";
  std::vector<fs::path> folders;
  for (const fs::directory_entry& entry : fs::directory_iterator(root))
    if (entry.is_directory()) folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  ASSERT_FALSE(folders.empty()) << root << " holds no model folders";
  for (const fs::path& folder : folders) {
    SCOPED_TRACE(folder.string());
    try {
      const fs::path checkpoint = checkpoint_folder(folder);
      ::testing::internal::CaptureStderr();
      const Model model = load_model(checkpoint);
      EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "every tensor is used";
      EXPECT_EQ(int64_t(model.weights.layers.size()), model.config.num_hidden_layers);
      EXPECT_EQ(model.weights.bytes_total, data_bytes_on_disk(checkpoint));
      EXPECT_FALSE(model.weights.lm_head.empty());
    } catch (const Error& error) {
      ADD_FAILURE() << error.what();
    }
  }
}

}  // namespace
}  // namespace jambo::model
