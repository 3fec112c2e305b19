// Data-driven comparison with Hugging Face tokenizers: every folder under
// tests/fixtures/tokenizers/ holds a tokenizer.json (maybe a tokenizer_config.json) and a
// cases.json made by tools/ with HF: {"cases": [{"text", "ids", "ids_no_special", "decoded",
// "decoded_skip_special"}]}. Each case must match exactly, including incremental decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer_test_util.h"

namespace jambo::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

std::vector<std::filesystem::path> fixture_folders() {
  std::vector<std::filesystem::path> folders;
  const auto root = test::source_dir() / "tests/fixtures/tokenizers";
  if (!std::filesystem::is_directory(root)) return folders;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (std::filesystem::exists(entry.path() / "cases.json")) folders.push_back(entry.path());
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

std::string incremental_decode(const Tokenizer& tokenizer, const Ids& ids, bool skip_special) {
  IncrementalDecoder decoder(tokenizer, skip_special);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  return text + decoder.finish();
}

TEST(TokenizerFixtures, ExistForBothFamilies) { EXPECT_GE(fixture_folders().size(), 2u); }

class TokenizerFixture : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(TokenizerFixture, MatchesHuggingFace) {
  const std::filesystem::path folder = GetParam();
  const Tokenizer tokenizer = Tokenizer::load(folder);
  std::ifstream in(folder / "cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in).at("cases");
  ASSERT_FALSE(cases.empty());
  size_t num_failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const nlohmann::json& c = cases[i];
    const std::string text = c.at("text");
    const Ids ids = c.at("ids");
    const Ids ids_no_special = c.at("ids_no_special");
    SCOPED_TRACE(::testing::Message() << "case " << i << ": " << nlohmann::json(text).dump());
    const Ids encoded = tokenizer.encode(text, true);
    const Ids encoded_no_special = tokenizer.encode(text, false);
    EXPECT_EQ(encoded, ids);
    EXPECT_EQ(encoded_no_special, ids_no_special);
    EXPECT_EQ(tokenizer.decode(ids, false), c.at("decoded").get<std::string>());
    EXPECT_EQ(tokenizer.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
    EXPECT_EQ(incremental_decode(tokenizer, ids, false), c.at("decoded").get<std::string>());
    EXPECT_EQ(incremental_decode(tokenizer, ids, true),
              c.at("decoded_skip_special").get<std::string>());
    if (encoded != ids || encoded_no_special != ids_no_special) ++num_failed;
  }
  EXPECT_EQ(num_failed, 0u) << "of " << cases.size() << " cases in " << folder.filename();
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerFixture, ::testing::ValuesIn(fixture_folders()),
                         [](const ::testing::TestParamInfo<std::filesystem::path>& info) {
                           std::string name = info.param.filename().string();
                           std::replace_if(
                               name.begin(), name.end(), [](char c) { return !std::isalnum(c); },
                               '_');
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TokenizerFixture);

}  // namespace
}  // namespace jambo::tokenizer
