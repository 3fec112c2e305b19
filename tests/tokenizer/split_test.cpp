// Splitting: the GPT-2 pattern against Python's `regex` module (expected values computed with
// regex.findall on the same pattern), and HF's delimiter behaviours on hand-worked examples.
#include <gtest/gtest.h>

#include "tokenizer/split.h"

namespace jambo::tokenizer {
namespace {

std::vector<std::string> gpt2_words(const std::string& text) {
  return split_at_matches(text, find_gpt2_words(text), SplitBehavior::kIsolated, false);
}

using Words = std::vector<std::string>;

TEST(Gpt2Pattern, MatchesPythonRegexFindall) {
  EXPECT_EQ(gpt2_words("Hello  world\t\tx 12 !!"),
            (Words{"Hello", " ", " world", "\t", "\t", "x", " 12", " !!"}));
  EXPECT_EQ(gpt2_words("I'm can't we'll they're I've she'd 'S"),
            (Words{"I", "'m", " can", "'t", " we", "'ll", " they", "'re", " I", "'ve", " she", "'d",
                   " '", "S"}));
  EXPECT_EQ(gpt2_words("  leading and trailing  "),
            (Words{" ", " leading", " and", " trailing", "  "}));
  EXPECT_EQ(gpt2_words("a\n\n b\u3000c"), (Words{"a", "\n\n", " b", "\u3000", "c"}));
  EXPECT_EQ(gpt2_words("naïve café 東京 ٣٤ ½"), (Words{"naïve", " café", " 東京", " ٣٤", " ½"}));
  EXPECT_EQ(gpt2_words("emoji 👍🏽 ok"), (Words{"emoji", " 👍🏽", " ok"}));
  EXPECT_EQ(gpt2_words("x\u200By"), (Words{"x", "\u200B", "y"}));
  EXPECT_EQ(gpt2_words("a  \tb"), (Words{"a", "  ", "\t", "b"}));
  EXPECT_EQ(gpt2_words("''s"), (Words{"''", "s"}));
  EXPECT_EQ(gpt2_words(""), Words{});
}

TEST(Gpt2Pattern, LongInputIsFast) {
  const std::string text(200000, 'a');
  EXPECT_EQ(gpt2_words(text).size(), 1u);
  const std::string spaces(200000, ' ');
  EXPECT_EQ(gpt2_words(spaces).size(), 1u);
}

TEST(SplitBehaviors, MatchHuggingFace) {
  // "a-b--c" split on "-"; expected pieces as HF's NormalizedString::split documents them.
  const std::string text = "a-b--c";
  const auto dashes = find_literal(text, "-");
  EXPECT_EQ(split_at_matches(text, dashes, SplitBehavior::kRemoved, false), (Words{"a", "b", "c"}));
  EXPECT_EQ(split_at_matches(text, dashes, SplitBehavior::kIsolated, false),
            (Words{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(split_at_matches(text, dashes, SplitBehavior::kMergedWithPrevious, false),
            (Words{"a-", "b-", "-", "c"}));
  EXPECT_EQ(split_at_matches(text, dashes, SplitBehavior::kMergedWithNext, false),
            (Words{"a", "-b", "-", "-c"}));
  EXPECT_EQ(split_at_matches(text, dashes, SplitBehavior::kContiguous, false),
            (Words{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(split_at_matches(text, dashes, SplitBehavior::kRemoved, true), (Words{"-", "-", "-"}));
}

}  // namespace
}  // namespace jambo::tokenizer
