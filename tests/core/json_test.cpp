// parse_json and read_json_file: nesting limited while parsing, errors that say what is wrong, integers that
// never wrap, and only regular files read.
#include "core/json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace jambo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;

std::string nested_array(int levels) { return std::string(size_t(levels), '[') + std::string(size_t(levels), ']'); }

std::string parse_error(const std::string& text) {
  try {
    parse_json(text);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(ParseJson, HoldsNestingOfTheLimitAndRefusesOneMore) {
  EXPECT_EQ(parse_json(nested_array(kMaxJsonDepth)).dump(), nested_array(kMaxJsonDepth));
  EXPECT_EQ(parse_error(nested_array(kMaxJsonDepth + 1)), "JSON nested deeper than 256 levels");
  // The object is one level: its member may nest one level less.
  const std::string member = nested_array(kMaxJsonDepth - 1);
  EXPECT_EQ(parse_json(R"({"a": 1, "id": )" + member + "}")["id"].dump(), member);
  EXPECT_EQ(parse_error(R"({"a": 1, "id": [)" + member + "]}"), "field 'id': JSON nested deeper than 256 levels");
}

TEST(ParseJson, AMillionLevelsAreRefusedWithoutACrash) {
  EXPECT_EQ(parse_error(R"({"request": )" + nested_array(1'000'000) + "}"),
            "field 'request': JSON nested deeper than 256 levels");
  std::string deep_objects;
  for (int i = 0; i < 1'000'000; ++i) deep_objects += R"({"name":)";
  EXPECT_EQ(parse_error(R"([{"name": )" + deep_objects), "JSON nested deeper than 256 levels");
}

TEST(ParseJson, TheFieldNamedIsTheTopLevelOne) {
  try {
    parse_json(R"({"messages": [{"content": )" + nested_array(300) + "}]}");
    FAIL() << "no error";
  } catch (const JsonTooDeep& error) {
    EXPECT_EQ(error.field, "messages");
  }
}

TEST(ParseJson, MalformedTextSaysWhere) {
  EXPECT_THAT(parse_error("{\"a\": 1,\n \"b\": }"), AllOf(HasSubstr("malformed JSON"), HasSubstr("line 2")));
  EXPECT_THAT(parse_error(""), HasSubstr("malformed JSON"));
}

TEST(JsonInt64, NeverWrapsAnUnsignedValue) {
  EXPECT_EQ(json_int64(json(INT64_MAX)), INT64_MAX);
  EXPECT_EQ(json_int64(json(-5)), -5);
  EXPECT_EQ(json_int64(parse_json("18446744073709551615")), std::nullopt);
  EXPECT_EQ(json_int64(parse_json("9223372036854775808")), std::nullopt);
  EXPECT_EQ(json_int64(json(1.5)), std::nullopt);
  EXPECT_EQ(json_int64(json("7")), std::nullopt);
}

class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "jambo-json-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempFolder() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string read_error(const std::filesystem::path& path) {
  try {
    read_json_file(path);
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

// A long string is cut where a character starts: cut inside a UTF-8 sequence, the JSON writer threw a type_error
// instead of the message (found by fuzz_detokenize_request; tests/fuzz/findings/detokenize_request).
TEST(DescribeJson, CutsALongStringWhereACharacterStarts) {
  const std::string face = "\xF0\x9F\x98\x80";  // 4 bytes
  EXPECT_EQ(describe_json(json(std::string(59, 'x') + face + "tail")), "\"" + std::string(59, 'x') + "\"...");
  std::string faces;
  for (int i = 0; i < 20; ++i) faces += face;
  EXPECT_EQ(describe_json(json(faces)), json(faces.substr(0, 60)).dump() + "...");
  EXPECT_EQ(describe_json(json::array({faces})), "an array of 1 elements");
}

TEST(ReadJsonFile, NamesTheFileAndWhatIsWrong) {
  TempFolder folder;
  const std::filesystem::path file = folder.path() / "config.json";
  EXPECT_EQ(read_error(file), file.string() + ": no such file");
  ASSERT_EQ(mkfifo(file.c_str(), 0600), 0);
  EXPECT_EQ(read_error(file), file.string() + ": not a regular file");
  std::filesystem::remove(file);
  std::ofstream(file) << R"({"chat_template": [{"name": )" << nested_array(100'000) << "}]}";
  EXPECT_EQ(read_error(file), file.string() + ": field 'chat_template': JSON nested deeper than 256 levels");
}

}  // namespace
}  // namespace jambo
