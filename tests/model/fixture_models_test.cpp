// Every checkpoint under tests/fixtures/models/ (made by tools/ with Hugging Face transformers)
// loads: the real on-disk layouts, as transformers saves them.
#include "core/error.h"
#include "model/weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

namespace jambo {
namespace {

namespace fs = std::filesystem;

TEST(FixtureModels, EveryFixtureCheckpointLoads) {
  const fs::path root = fs::path(JAMBO_SOURCE_DIR) / "tests" / "fixtures" / "models";
  if (!fs::exists(root)) GTEST_SKIP() << root << " does not exist yet";
  std::vector<fs::path> folders;
  for (const fs::directory_entry& entry : fs::directory_iterator(root))
    if (entry.is_directory()) folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  ASSERT_FALSE(folders.empty()) << root << " holds no model folders";
  for (const fs::path& folder : folders) {
    SCOPED_TRACE(folder.string());
    try {
      const Model model = load_model(folder);
      EXPECT_EQ(int64_t(model.weights.layers.size()), model.config.num_hidden_layers);
      EXPECT_GT(model.weights.bytes_total, 0);
      EXPECT_FALSE(model.weights.lm_head.empty());
    } catch (const Error& error) {
      ADD_FAILURE() << error.what();
    }
  }
}

}  // namespace
}  // namespace jambo
