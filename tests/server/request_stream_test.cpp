// What a stream sends while a sample runs: new tokens at once, text held back only as long as a stop
// string could still cut it, never half a UTF-8 character.
#include "server/request_stream.h"

#include <gtest/gtest.h>

namespace jambo::server {
namespace {

struct Sample {
  engine::SampleOutput output;
  std::string text;
  void add(int32_t id, const std::string& piece) {
    output.ids.push_back(id);
    output.logprobs.push_back(-1.0);
    output.top_logprobs.emplace_back();
    text += piece;
  }
};

std::string taken_text(RequestStream& stream) {
  std::string text;
  for (const StreamEvent& event : stream.take(std::chrono::milliseconds(0))) text += event.text;
  return text;
}

TEST(RequestStream, WithoutStopStringsTextGoesOutAtOnce) {
  RequestStream stream(1, 0, nullptr);
  Sample sample;
  sample.add(5, "Hello");
  stream.on_progress(0, {sample.output, sample.text, false});
  const std::vector<StreamEvent> events = stream.take(std::chrono::milliseconds(0));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "Hello");
  EXPECT_EQ(events[0].ids, std::vector<int32_t>{5});
  EXPECT_TRUE(events[0].prompt.has_value());  // the first event of a choice carries its prompt
  EXPECT_FALSE(stream.is_finished());
}

TEST(RequestStream, HoldsBackWhatAStopStringCouldStillCut) {
  RequestStream stream(1, /*max_stop_length=*/4, nullptr);  // e.g. stop "\n\nQ:"
  Sample sample;
  sample.add(1, "Hello wo");
  stream.on_progress(0, {sample.output, sample.text, false});
  EXPECT_EQ(taken_text(stream), "Hello");  // 3 bytes held back
  sample.add(2, "rld");
  stream.on_progress(0, {sample.output, sample.text, false});
  EXPECT_EQ(taken_text(stream), " wo");
  sample.output.finish_reason = "stop";
  stream.on_progress(0, {sample.output, sample.text, true});
  EXPECT_EQ(taken_text(stream), "rld");
  EXPECT_TRUE(stream.is_finished());
}

TEST(RequestStream, NeverSplitsAUtf8Character) {
  RequestStream stream(1, /*max_stop_length=*/2, nullptr);
  Sample sample;
  sample.add(1, "a\u00e9b");  // 'a', 2-byte 'é', 'b': holding back 1 byte leaves "aé"
  stream.on_progress(0, {sample.output, sample.text, false});
  EXPECT_EQ(taken_text(stream), "a\u00e9");
  sample.text = "a\u00e9";  // a stop string "b" was found and cut
  sample.add(2, "");
  stream.on_progress(0, {sample.output, sample.text, true});
  EXPECT_EQ(taken_text(stream), "");
  Sample wide;
  RequestStream wide_stream(1, /*max_stop_length=*/2, nullptr);
  wide.add(1, "x\u20ac");  // 3-byte '€' last: one byte held back would split it, so all of it waits
  wide_stream.on_progress(0, {wide.output, wide.text, false});
  EXPECT_EQ(taken_text(wide_stream), "x");
}

TEST(RequestStream, ReportsLatencies) {
  struct Recorder : LatencyObserver {
    int first = 0, between = 0, whole = 0;
    void time_to_first_token(double) override { ++first; }
    void inter_token_latency(double) override { ++between; }
    void end_to_end(double) override { ++whole; }
  } recorder;
  RequestStream stream(2, 0, &recorder);
  Sample a, b;
  a.add(1, "x");
  stream.on_progress(0, {a.output, a.text, false});
  b.add(1, "y");
  stream.on_progress(1, {b.output, b.text, false});
  a.add(2, "z");
  stream.on_progress(0, {a.output, a.text, true});
  EXPECT_EQ(recorder.whole, 0);
  stream.on_progress(1, {b.output, b.text, true});
  EXPECT_EQ(recorder.first, 1);    // once per request
  EXPECT_EQ(recorder.between, 1);  // per choice, between its own tokens
  EXPECT_EQ(recorder.whole, 1);    // once every choice ended
}

TEST(RequestStream, FailureReachesTheWaitingSide) {
  RequestStream stream(1, 0, nullptr);
  stream.fail({503, "the engine loop stopped: boom"});
  EXPECT_TRUE(stream.take(std::chrono::seconds(5)).empty());  // returns at once: the error woke it
  ASSERT_TRUE(stream.error().has_value());
  EXPECT_EQ(stream.error()->status, 503);
  EXPECT_EQ(stream.error()->message, "the engine loop stopped: boom");
}

}  // namespace
}  // namespace jambo::server
