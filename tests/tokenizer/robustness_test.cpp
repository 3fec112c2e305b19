// Arbitrary input never crashes: random bytes (invalid UTF-8 included) encode, and random ids
// decode to valid UTF-8, also token by token, where the pieces add up to the whole decode.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace jambo::tokenizer {
namespace {

std::vector<std::filesystem::path> tokenizer_folders() {
  std::vector<std::filesystem::path> folders;
  for (const auto& root : {test::source_dir() / "tests/tokenizer/data",
                           test::source_dir() / "tests/fixtures/tokenizers"}) {
    if (!std::filesystem::is_directory(root)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(root))
      folders.push_back(entry.path());
  }
  return folders;
}

TEST(TokenizerRobustness, RandomBytesAndIds) {
  std::mt19937 random(1234);
  for (const auto& folder : tokenizer_folders()) {
    SCOPED_TRACE(folder.filename().string());
    const Tokenizer tokenizer = Tokenizer::load(folder);
    for (int round = 0; round < 300; ++round) {
      std::string bytes(random() % 40, '\0');
      for (char& byte : bytes) byte = static_cast<char>(random() % 256);
      const std::vector<int32_t> ids = tokenizer.encode(bytes);
      EXPECT_TRUE(unicode::is_valid_utf8(tokenizer.decode(ids)));

      std::vector<int32_t> random_ids(random() % 20);
      for (int32_t& id : random_ids)
        id = static_cast<int32_t>(random() % (tokenizer.vocab_size() + 3));
      EXPECT_TRUE(unicode::is_valid_utf8(tokenizer.decode(random_ids, round % 2 == 0)));
      IncrementalDecoder decoder(tokenizer, round % 2 == 0);
      std::string streamed;
      for (int32_t id : random_ids) {
        const std::string piece = decoder.push(id);
        EXPECT_TRUE(unicode::is_valid_utf8(piece));
        streamed += piece;
      }
      EXPECT_EQ(streamed + decoder.finish(), tokenizer.decode(random_ids, round % 2 == 0));
    }
  }
}

}  // namespace
}  // namespace jambo::tokenizer
