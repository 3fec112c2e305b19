#include "forensics/trace_reader.h"

#include <gtest/gtest.h>

#include <sstream>

namespace jambo::forensics {
namespace {

TEST(TraceReader, TellsTheLifeOfOneRequestInOrder) {
  std::istringstream trace(
      R"({"type":"event","step":0,"request":"a","sample":0,"event":"queued"})"
      "\n"
      R"({"type":"event","step":0,"request":"b","sample":0,"event":"queued"})"
      "\n"
      R"({"type":"step","step":1,"rows":[{"request":"a","sample":0,"phase":"prefill","start":0,"num_tokens":4,"slot":7,"generation":3,"kv_blocks":[0]},{"request":"b","sample":0,"phase":"prefill","start":0,"num_tokens":1,"slot":2,"generation":1,"kv_blocks":[1]}]})"
      "\n"
      "not json\n"
      R"({"type":"step","step":2,"rows":[{"request":"a","sample":0,"phase":"decode","start":4,"num_tokens":1,"slot":7,"generation":3,"kv_blocks":[0]}]})"
      "\n"
      R"({"type":"event","step":2,"request":"a","sample":0,"event":"finished","reason":"length"})"
      "\n");
  const RequestLife life = read_request_life(trace, "a");
  ASSERT_EQ(life.lines.size(), 4u);
  EXPECT_NE(life.lines[0].find("queued"), std::string::npos);
  EXPECT_NE(life.lines[1].find("positions 0..3 (4 tokens)"), std::string::npos);
  EXPECT_NE(life.lines[1].find("slot 7 gen 3"), std::string::npos);
  EXPECT_NE(life.lines[2].find("decode"), std::string::npos);
  EXPECT_NE(life.lines[2].find("position 4"), std::string::npos);
  EXPECT_NE(life.lines[3].find("reason=length"), std::string::npos);
  EXPECT_EQ(life.num_unreadable, 1);
}

TEST(TraceReader, ReadsPastLinesWithFieldsOfTheWrongType) {
  std::istringstream trace(
      R"({"type":5,"step":"x"})"
      "\n"
      R"({"type":"step","step":1,"rows":[{"request":"a","start":9223372036854775807,"num_tokens":9,"slot":"s"}]})"
      "\n"
      R"({"type":"event","step":2,"request":"a","event":"finished"})"
      "\n");
  const RequestLife life = read_request_life(trace, "a");
  ASSERT_EQ(life.lines.size(), 2u);
  EXPECT_NE(life.lines[1].find("finished"), std::string::npos);
}

TEST(TraceReader, FindsASequenceByTheIdBackendErrorsName) {
  std::istringstream trace(
      R"({"type":"event","step":0,"request":"a","sample":1,"sequence":17,"event":"queued"})"
      "\n"
      R"({"type":"step","step":1,"rows":[{"request":"a","sample":0,"sequence":16,"start":0,"num_tokens":2},)"
      R"({"request":"a","sample":1,"sequence":17,"start":0,"num_tokens":2}]})"
      "\n");
  const RequestLife life = read_sequence_life(trace, 17);
  ASSERT_EQ(life.lines.size(), 2u);
  EXPECT_NE(life.lines[0].find("sample 1 seq 17"), std::string::npos) << life.lines[0];
  EXPECT_NE(life.lines[1].find("sample 1 seq 17"), std::string::npos) << life.lines[1];
}

TEST(TraceReader, MatchesNumericIdsAsText) {
  std::istringstream trace(R"({"type":"event","step":0,"request":12,"event":"queued"})");
  EXPECT_EQ(read_request_life(trace, "12").lines.size(), 1u);
  std::istringstream again(R"({"type":"event","step":0,"request":12,"event":"queued"})");
  EXPECT_TRUE(read_request_life(again, "1").lines.empty());
}

}  // namespace
}  // namespace jambo::forensics
