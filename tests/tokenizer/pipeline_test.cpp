// The whole pipeline on the hand-written tokenizers of tests/tokenizer/data; every expected id
// list is worked out by hand in the comments from the vocab and merges in those files.
#include <gtest/gtest.h>

#include <chrono>

#include "tokenizer_test_util.h"

namespace jambo::tokenizer {
namespace {

using Ids = std::vector<int32_t>;
const std::string kFffd = "\xEF\xBF\xBD";

// mini-sp-prepend: normalizer Prepend("▁") + Replace(" " -> "▁"), no pre-tokenizer, byte
// fallback, fuse_unk; merges by rank: ▁h, ll, ▁he, llo, ▁hello, ▁w, or, ▁wor, ld, ▁world, he.
class SentencePieceStyle : public ::testing::Test {
 protected:
  Tokenizer tokenizer = test::load_test_tokenizer("mini-sp-prepend");
};

TEST_F(SentencePieceStyle, MergesByRank) {
  EXPECT_EQ(tokenizer.encode("hello world", false), (Ids{19, 24}));
  EXPECT_EQ(tokenizer.encode("hello world"), (Ids{1, 19, 24}));  // template adds <s>
  // "▁he": ▁h (rank 0) wins over he (rank 10), then ▁he (rank 2).
  EXPECT_EQ(tokenizer.encode("he", false), (Ids{17}));
}

TEST_F(SentencePieceStyle, EqualRanksMergeLeftmostFirst) {
  // "▁lll": both l-l pairs have rank 1; the left one merges: ▁ ll l.
  EXPECT_EQ(tokenizer.encode("lll", false), (Ids{7, 16, 10}));
}

TEST_F(SentencePieceStyle, ByteFallbackAndUnknowns) {
  EXPECT_EQ(tokenizer.encode("中", false), (Ids{7, 4, 5, 6}));  // E4 B8 AD
  EXPECT_EQ(tokenizer.encode("\n", false), (Ids{7, 3}));
  // 'x' has no token and no byte token: unk; consecutive unks fuse.
  EXPECT_EQ(tokenizer.encode("xx", false), (Ids{7, 0}));
  EXPECT_EQ(tokenizer.encode("xhx", false), (Ids{7, 0, 8, 0}));
}

TEST_F(SentencePieceStyle, EmptyText) {
  EXPECT_EQ(tokenizer.encode("", false), Ids{});
  EXPECT_EQ(tokenizer.encode(""), (Ids{1}));
}

TEST_F(SentencePieceStyle, AddedTokensSplitTheRawTextAndEachPieceIsNormalized) {
  // The normalizer's Prepend applies to each piece between added tokens, as in HF.
  EXPECT_EQ(tokenizer.encode("hello<s>world", false), (Ids{19, 1, 24}));
  // <sep> has lstrip and rstrip: it swallows the spaces around it.
  EXPECT_EQ(tokenizer.encode("hello <sep> world", false), (Ids{19, 26, 24}));
  // "ab" is single_word: it matches at the start but not inside "cab" -> "▁▁cab".
  EXPECT_EQ(tokenizer.encode("ab cab", false), (Ids{27, 7, 7, 30, 28, 29}));
  // "xyz" is a normalized added token: it is matched as its normalized form "▁xyz" in the
  // normalized text, so only after a space (x, y, z alone are unknown: one fused unk).
  EXPECT_EQ(tokenizer.encode("a xyz", false), (Ids{7, 28, 31}));
  EXPECT_EQ(tokenizer.encode("axyz", false), (Ids{7, 28, 0}));
}

TEST_F(SentencePieceStyle, DecodesThroughTheDecoderChain) {
  EXPECT_EQ(tokenizer.decode(Ids{1, 19, 24}), "<s> hello world");
  EXPECT_EQ(tokenizer.decode(Ids{1, 19, 24}, true),
            "hello world");  // Strip removes the leading space
  EXPECT_EQ(tokenizer.decode(Ids{7, 4, 5, 6}), "中");
  EXPECT_EQ(tokenizer.decode(Ids{4, 5}), kFffd + kFffd);  // one U+FFFD per byte token
  EXPECT_EQ(tokenizer.decode(Ids{4, 5, 6, 4, 19}), kFffd + kFffd + kFffd + kFffd + " hello");
  EXPECT_EQ(tokenizer.decode(Ids{19, 9999}), "hello");  // unknown ids are skipped
}

TEST_F(SentencePieceStyle, SpecialTokensAndConfig) {
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_TRUE(tokenizer.is_special(1));
  EXPECT_FALSE(tokenizer.is_special(26));
  EXPECT_FALSE(tokenizer.is_special(19));
  EXPECT_EQ(tokenizer.token_to_id("▁world"), 24);
  EXPECT_EQ(tokenizer.id_to_token(24), "▁world");
  EXPECT_EQ(tokenizer.vocab_size(), 32);
}

TEST_F(SentencePieceStyle, LongInputsAreNotQuadratic) {
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tokenizer.encode(std::string(20000, 'l'), false);
  EXPECT_EQ(ids.size(), 10001u);  // ▁ then 10000 × ll
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 16);
  std::string text;
  while (text.size() < 20000) text += "hello world 中 ";
  EXPECT_FALSE(tokenizer.encode(text).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// mini-metaspace: the same vocab with a Metaspace pre-tokenizer (prepend_scheme "first"), merges
// in the ["a", "b"] form, no post_processor (tokenizer_config.json adds BOS and EOS).
class MetaspaceStyle : public ::testing::Test {
 protected:
  Tokenizer tokenizer = test::load_test_tokenizer("mini-metaspace");
};

TEST_F(MetaspaceStyle, PrependsOnlyAtTheStartOfTheText) {
  EXPECT_EQ(tokenizer.encode("hello world", false), (Ids{19, 24}));
  // After a leading added token the text no longer starts at offset 0: "hello" gets no "▁",
  // and merges ll (1), llo (3), he (10).
  EXPECT_EQ(tokenizer.encode("<s>hello world", false), (Ids{1, 25, 18, 24}));
  EXPECT_EQ(tokenizer.encode("hello  world", false), (Ids{19, 7, 24}));  // "▁" alone between
}

TEST_F(MetaspaceStyle, ConfigAddsBosAndEosWithoutPostProcessor) {
  EXPECT_EQ(tokenizer.encode("hello"), (Ids{1, 19, 2}));
}

TEST_F(MetaspaceStyle, DecoderDropsTheFirstTokensPrefix) {
  EXPECT_EQ(tokenizer.decode(Ids{19, 24}), "hello world");
  EXPECT_EQ(tokenizer.decode(Ids{1, 19, 24}), "<s> hello world");
}

// mini-bytelevel: GPT-2 byte-level; merges Ġh, el, lo, Ġhel, Ġhello; <|endoftext|> appended.
class ByteLevelStyle : public ::testing::Test {
 protected:
  Tokenizer tokenizer = test::load_test_tokenizer("mini-bytelevel");
};

TEST_F(ByteLevelStyle, SplitsWithTheGpt2PatternAndMapsBytes) {
  // "hello" -> h el lo; " world" -> Ġ w o r l d (no merges); "!".
  EXPECT_EQ(tokenizer.encode("hello world!", false), (Ids{0, 11, 12, 4, 5, 3, 6, 2, 7, 8}));
  EXPECT_EQ(tokenizer.encode(" hello"), (Ids{14, 17}));
  EXPECT_EQ(tokenizer.encode("ä", false), (Ids{15, 16}));  // C3 A4 -> Ã ¤
  EXPECT_EQ(tokenizer.encode("hello  world", false), (Ids{0, 11, 12, 4, 4, 5, 3, 6, 2, 7}));
}

TEST_F(ByteLevelStyle, DecodesBytesLossily) {
  EXPECT_EQ(tokenizer.decode(Ids{14, 4, 5, 3, 6, 2, 7, 17}), " hello world<|endoftext|>");
  EXPECT_EQ(tokenizer.decode(Ids{14, 17}, true), " hello");
  EXPECT_EQ(tokenizer.decode(Ids{15, 16}), "ä");
  EXPECT_EQ(tokenizer.decode(Ids{15}), kFffd);
  EXPECT_EQ(tokenizer.decode(Ids{16, 15, 0}), kFffd + kFffd + "h");
}

// Incremental decoding emits only complete characters and adds up to decode() of the whole.
std::string decode_incrementally(const Tokenizer& tokenizer, const Ids& ids, bool skip_special,
                                 std::vector<std::string>* pieces = nullptr) {
  IncrementalDecoder decoder(tokenizer, skip_special);
  std::string text;
  for (int32_t id : ids) {
    const std::string piece = decoder.push(id);
    if (pieces) pieces->push_back(piece);
    text += piece;
  }
  return text + decoder.finish();
}

TEST(IncrementalDecoder, WaitsForCompleteCharacters) {
  const Tokenizer tokenizer = test::load_test_tokenizer("mini-sp-prepend");
  std::vector<std::string> pieces;
  const Ids ids{1, 19, 7, 4, 5, 6, 24};
  EXPECT_EQ(decode_incrementally(tokenizer, ids, true, &pieces), "hello 中 world");
  // The byte run E4 B8 AD is emitted when the run ends (a byte could still follow and turn the
  // whole run into U+FFFDs).
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "hello", " ", "", "", "", "中 world"}));
  EXPECT_EQ(decode_incrementally(tokenizer, ids, false), tokenizer.decode(ids, false));
}

TEST(IncrementalDecoder, EqualsWholeDecodeOnEveryStyle) {
  for (const std::string name : {"mini-sp-prepend", "mini-metaspace", "mini-bytelevel"}) {
    const Tokenizer tokenizer = test::load_test_tokenizer(name);
    const Ids ids = tokenizer.encode("<s>hello  world 中\nä he<s> lll ab hello");
    for (bool skip : {false, true}) {
      EXPECT_EQ(decode_incrementally(tokenizer, ids, skip), tokenizer.decode(ids, skip)) << name;
    }
  }
}

TEST(IncrementalDecoder, AnInvalidByteRunIsEmittedOnlyOnceFinal) {
  const Tokenizer tokenizer = test::load_test_tokenizer("mini-sp-prepend");
  // E4 B8 AD is 中, but with another E4 the run is invalid: four U+FFFD, as decode() gives.
  const Ids ids{19, 4, 5, 6, 4, 24};
  EXPECT_EQ(decode_incrementally(tokenizer, ids, false), tokenizer.decode(ids));
  EXPECT_EQ(tokenizer.decode(ids), "hello" + kFffd + kFffd + kFffd + kFffd + " world");
}

TEST(IncrementalDecoder, FinishFlushesAnIncompleteTail) {
  const Tokenizer tokenizer = test::load_test_tokenizer("mini-sp-prepend");
  IncrementalDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.push(19), "hello");
  EXPECT_EQ(decoder.push(4), "");
  EXPECT_EQ(decoder.finish(), kFffd);
}

}  // namespace
}  // namespace jambo::tokenizer
