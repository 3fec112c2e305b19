// BPE model options on small inline vocabularies (no normalizer or pre-tokenizer, so the whole
// text is one word); expected ids follow HF's BPE tests and the rules in models/bpe/model.rs.
#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace jambo::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

Tokenizer load_model(const std::string& name, const std::string& model_fields) {
  return Tokenizer::load(
      test::write_tokenizer_folder(name, R"({"model": {"type": "BPE", )" + model_fields + "}}"));
}

TEST(BpeOptions, IgnoreMergesTakesWholeWordsFromTheVocab) {
  const std::string vocab =
      R"("vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}, "merges": ["a b"])";
  EXPECT_EQ(load_model("merges", vocab).encode("abc"), (Ids{3, 2}));
  EXPECT_EQ(load_model("ignore-merges", R"("ignore_merges": true, )" + vocab).encode("abc"),
            (Ids{4}));
}

TEST(BpeOptions, UnknownCharacters) {
  const std::string vocab = R"("vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3}, "merges": ["a b"])";
  EXPECT_EQ(load_model("unk", R"("unk_token": "<unk>", )" + vocab).encode("axxb"),
            (Ids{1, 0, 0, 2}));
  EXPECT_EQ(
      load_model("unk-fused", R"("unk_token": "<unk>", "fuse_unk": true, )" + vocab).encode("axxb"),
      (Ids{1, 0, 2}));
  // Without an unk token an unknown character is dropped, and its neighbours can then merge.
  EXPECT_EQ(load_model("no-unk", vocab).encode("axb"), (Ids{3}));
}

TEST(BpeOptions, ByteFallbackNeedsEveryByte) {
  const std::string vocab =
      R"("vocab": {"<unk>": 0, "<0x78>": 1, "<0xC3>": 2, "a": 3}, "merges": [])";
  const Tokenizer tokenizer =
      load_model("byte-fallback", R"("unk_token": "<unk>", "byte_fallback": true, )" + vocab);
  EXPECT_EQ(tokenizer.encode("xa"), (Ids{1, 3}));
  EXPECT_EQ(tokenizer.encode("\xC3\xA9"), (Ids{0}));  // é = C3 A9, and <0xA9> is missing: unk
}

TEST(BpeOptions, SubwordPrefixAndSuffix) {
  const Tokenizer prefixed = load_model("prefix", R"("continuing_subword_prefix": "##",
      "vocab": {"a": 0, "##b": 1, "##c": 2, "ab": 3, "abc": 4}, "merges": [["a", "##b"], ["ab", "##c"]])");
  EXPECT_EQ(prefixed.encode("abc"), (Ids{4}));
  const Tokenizer suffixed = load_model("suffix", R"("end_of_word_suffix": "</w>",
      "vocab": {"a": 0, "b</w>": 1, "ab</w>": 2}, "merges": ["a b</w>"])");
  EXPECT_EQ(suffixed.encode("ab"), (Ids{2}));
}

TEST(BpeOptions, RepeatedCharacterRunsAreFast) {
  // 20000 "a": pairs merge left to right into "aa", then "aaaa".
  const Tokenizer tokenizer =
      load_model("runs", R"("vocab": {"a": 0, "aa": 1, "aaaa": 2}, "merges": ["a a", "aa aa"])");
  const Ids ids = tokenizer.encode(std::string(20001, 'a'));
  ASSERT_EQ(ids.size(), 5001u);
  EXPECT_EQ(ids.front(), 2);
  EXPECT_EQ(ids.back(), 0);
}

}  // namespace
}  // namespace jambo::tokenizer
