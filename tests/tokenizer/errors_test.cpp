// Bad tokenizer files are rejected with a jambo::Error naming the file and the field.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer_test_util.h"

namespace jambo::tokenizer {
namespace {

// Loads a tokenizer.json and returns the error message (empty if it loaded).
std::string load_error(const std::string& name, const std::string& json) {
  try {
    Tokenizer::load(test::write_tokenizer_folder(name, json));
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

const std::string kModel =
    R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

TEST(TokenizerErrors, MissingFile) {
  try {
    Tokenizer::load(std::filesystem::temp_directory_path() / "jambo-no-such-tokenizer");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tokenizer.json: file not found"), std::string::npos);
  }
}

TEST(TokenizerErrors, MalformedJson) {
  EXPECT_NE(load_error("malformed", R"({"model": {)").find("tokenizer.json: malformed JSON"),
            std::string::npos);
}

TEST(TokenizerErrors, UnsupportedModelType) {
  const std::string error =
      load_error("wordpiece", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  EXPECT_NE(error.find("field 'model'"), std::string::npos) << error;
  EXPECT_NE(error.find("'WordPiece' is not supported"), std::string::npos) << error;
}

TEST(TokenizerErrors, MergeOfUnknownToken) {
  const std::string error = load_error(
      "bad-merge", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  EXPECT_NE(error.find("field 'model.merges[0]'"), std::string::npos) << error;
  EXPECT_NE(error.find("'ab' is not in model.vocab"), std::string::npos) << error;
}

TEST(TokenizerErrors, MalformedMerge) {
  const std::string error = load_error(
      "merge-no-space", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})");
  EXPECT_NE(error.find("field 'model.merges[0]'"), std::string::npos) << error;
}

TEST(TokenizerErrors, MissingVocab) {
  const std::string error = load_error("no-vocab", R"({"model": {"type": "BPE", "merges": []}})");
  EXPECT_NE(error.find("missing field 'model.vocab'"), std::string::npos) << error;
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  EXPECT_NE(load_error("nfkc", R"({"normalizer": {"type": "NFKC"}, )" + kModel + "}")
                .find("field 'normalizer': normalizer type 'NFKC' is not supported"),
            std::string::npos);
  EXPECT_NE(load_error("whitespace", R"({"pre_tokenizer": {"type": "Whitespace"}, )" + kModel + "}")
                .find("pre_tokenizer type 'Whitespace' is not supported"),
            std::string::npos);
  EXPECT_NE(load_error("wordpiece-decoder", R"({"decoder": {"type": "WordPiece"}, )" + kModel + "}")
                .find("decoder type 'WordPiece' is not supported"),
            std::string::npos);
  EXPECT_NE(
      load_error("regex-split", R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\d+"},
                "behavior": "Isolated", "invert": false}, )" +
                                    kModel + "}")
          .find("regex pattern '\\d+' is not supported"),
      std::string::npos);
}

TEST(TokenizerErrors, HugeTokenId) {
  const std::string error = load_error(
      "huge-id", R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})");
  EXPECT_NE(error.find("field 'model.vocab[\"a\"]': token 'a' has id 2000000000"), std::string::npos)
      << error;
}

// Ids index tables: a sparse id would cost a table entry for every id below it.
TEST(TokenizerErrors, VocabIdsMustBeBelowTheNumberOfTokens) {
  const std::string error = load_error(
      "sparse-id", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 16777215}, "merges": []},
                       "added_tokens": [{"id": 1, "content": "<s>"}]})");
  EXPECT_NE(error.find("token 'b' has id 16777215; ids must be at least 0 and below 3"), std::string::npos) << error;
  EXPECT_NE(load_error("unsigned-id", R"({"model": {"type": "BPE", "vocab": {"a": 18446744073709551615}}})")
                .find("field 'model.vocab[\"a\"]': 18446744073709551615 is out of range"),
            std::string::npos);
}

TEST(TokenizerErrors, AddedTokenIdsMustBeBelowTheNumberOfTokens) {
  const std::string error =
      load_error("added-id", "{" + kModel + R"(, "added_tokens": [{"id": 1000000000, "content": "<huge>"}]})");
  EXPECT_NE(error.find("field 'added_tokens[0].id': token '<huge>' has id 1000000000; ids must be at least 0 and "
                       "below 4"),
            std::string::npos)
      << error;
}

TEST(TokenizerErrors, AddedTokensMayFillGapsInTheVocab) {
  EXPECT_EQ(load_error("gap", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}, "merges": []},
                                  "added_tokens": [{"id": 1, "content": "<s>"}]})"),
            "");
}

TEST(TokenizerErrors, WrongFieldType) {
  const std::string error = load_error(
      "bad-flag",
      R"({"model": {"type": "BPE", "byte_fallback": "yes", "vocab": {}, "merges": []}})");
  EXPECT_NE(error.find("field 'model.byte_fallback': expected true or false"), std::string::npos)
      << error;
}

TEST(TokenizerErrors, ValidMinimalFileLoads) {
  EXPECT_EQ(load_error("minimal", "{" + kModel + "}"), "");
}

}  // namespace
}  // namespace jambo::tokenizer
