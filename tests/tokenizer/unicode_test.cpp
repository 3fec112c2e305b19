// UTF-8 repair and the generated Unicode tables, against facts from the Unicode standard and
// Rust's String::from_utf8_lossy documentation.
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace jambo::tokenizer::unicode {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, LossyRepairReplacesEachMaximalInvalidPrefixOnce) {
  // Rust docs: from_utf8_lossy(b"Hello \xF0\x90\x80World") == "Hello �World".
  EXPECT_EQ(to_valid_utf8("Hello \xF0\x90\x80World"), "Hello " + kFffd + "World");
  // A lone continuation byte and a byte that can never start a character: one U+FFFD each.
  EXPECT_EQ(to_valid_utf8("a\x80\xFF"
                          "b"),
            "a" + kFffd + kFffd + "b");
  // E0 80 is an overlong form: E0 must be followed by A0..BF, so both bytes are errors.
  EXPECT_EQ(to_valid_utf8("\xE0\x80"), kFffd + kFffd);
  // Surrogates (ED A0..BF) are not UTF-8.
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(to_valid_utf8("\xE4\xB8\xAD"), "\xE4\xB8\xAD");  // 中 stays
  EXPECT_TRUE(is_valid_utf8(kFffd));
  EXPECT_FALSE(is_valid_utf8("\xE4\xB8"));
}

TEST(Utf8, EncodesEveryLength) {
  EXPECT_EQ(to_utf8(U'A'), "A");
  EXPECT_EQ(to_utf8(0xE9), "\xC3\xA9");
  EXPECT_EQ(to_utf8(0x4E2D), "\xE4\xB8\xAD");
  EXPECT_EQ(to_utf8(0x1F44D), "\xF0\x9F\x91\x8D");
}

TEST(UnicodeTables, GeneralCategories) {
  EXPECT_TRUE(is_letter(U'a'));
  EXPECT_TRUE(is_letter(0x00E9));   // é
  EXPECT_TRUE(is_letter(0x6771));   // 東 (Lo)
  EXPECT_TRUE(is_letter(0x02B0));   // ʰ (Lm)
  EXPECT_FALSE(is_letter(0x0301));  // combining acute accent is a mark
  EXPECT_TRUE(is_number(0x0663));   // Arabic-Indic three (Nd)
  EXPECT_TRUE(is_number(0x00BD));   // ½ (No)
  EXPECT_TRUE(is_number(0x2167));   // Ⅷ (Nl)
  EXPECT_FALSE(is_number(U'x'));
  EXPECT_FALSE(is_letter(0x1F44D));  // 👍
}

TEST(UnicodeTables, WhiteSpaceIsTheUnicodeProperty) {
  for (char32_t c : {0x09, 0x0A, 0x20, 0x85, 0xA0, 0x2003, 0x3000}) {
    EXPECT_TRUE(is_whitespace(c)) << static_cast<uint32_t>(c);
  }
  // Zero-width space and U+001C are not White_Space (though Python's isspace accepts U+001C).
  for (char32_t c : {0x200B, 0x1C, 0xFEFF, 0x61})
    EXPECT_FALSE(is_whitespace(c)) << static_cast<uint32_t>(c);
}

TEST(UnicodeTables, WordCharacters) {
  EXPECT_TRUE(is_word_char(U'_'));
  EXPECT_TRUE(is_word_char(0x0330));  // combining tilde below (mark)
  EXPECT_TRUE(is_word_char(0x200D));  // zero-width joiner
  EXPECT_TRUE(is_word_char(0x24B6));  // Ⓐ (Other_Alphabetic)
  EXPECT_FALSE(is_word_char(U'-'));
  EXPECT_FALSE(is_word_char(0x00BD));  // ½ is No, not \w
}

TEST(UnicodeTables, LowercaseUsesFullMappings) {
  EXPECT_EQ(to_lowercase("HeLLo ÉCOLE"), "hello école");
  EXPECT_EQ(to_lowercase("\xC4\xB0"), "i\xCC\x87");  // İ -> i + combining dot above
  EXPECT_EQ(to_lowercase("\xCE\xA3"), "\xCF\x83");   // Σ -> σ (no final-sigma context per char)
}

}  // namespace
}  // namespace jambo::tokenizer::unicode
