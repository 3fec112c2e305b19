// The server's engine loop: requests from many threads at once come out as if run alone (law 5),
// aborts free slots and blocks at once, a full loop refuses, a request whose logits are not finite fails alone
// (500), and a dying loop fails every stream loudly.
#include "support/engine_test_util.h"
#include "support/overflowing_model.h"
#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace jambo::server {
namespace {

using testing::Outputs;

constexpr auto kWait = std::chrono::milliseconds(50);

// Collects a stream's events into outputs per choice, as the HTTP side does.
Outputs drain(RequestStream& stream, const std::vector<engine::RequestSpec>& specs) {
  Outputs outputs;
  std::vector<std::pair<std::string, int64_t>> keys;
  for (const engine::RequestSpec& spec : specs)
    for (int64_t s = 0; s < spec.n; ++s) keys.emplace_back(spec.id, s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!stream.is_finished()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the stream does not finish");
    if (stream.error()) throw std::runtime_error(stream.error()->message);
    for (const StreamEvent& event : stream.take(kWait)) {
      engine::SampleOutput& output = outputs[keys.at(size_t(event.choice))];
      output.id = keys[size_t(event.choice)].first;
      output.sample = keys[size_t(event.choice)].second;
      if (event.prompt) {
        output.prompt_ids = event.prompt->prompt_ids;
        output.prompt_logprobs = event.prompt->prompt_logprobs;
        output.prompt_top_logprobs = event.prompt->prompt_top_logprobs;
      }
      output.ids.insert(output.ids.end(), event.ids.begin(), event.ids.end());
      output.logprobs.insert(output.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
      output.top_logprobs.insert(output.top_logprobs.end(), event.top_logprobs.begin(), event.top_logprobs.end());
      output.text += event.text;
      if (!event.finish_reason.empty()) output.finish_reason = event.finish_reason;
    }
  }
  return outputs;
}

engine::EngineOptions small_engine(const model::Model& model) {
  engine::EngineOptions options = testing::exact_engine_options(model, /*max_num_seqs=*/16, /*num_kv_blocks=*/1024,
                                                                /*kv_block_size=*/16, /*max_model_len=*/4096);
  options.max_num_batched_tokens = 32;
  return options;
}

// The loop's verdict on a submission, as a caller that waits for it sees it.
EngineLoop::Admission submit_and_wait(EngineLoop& loop, std::vector<engine::RequestSpec> specs,
                                      std::shared_ptr<RequestStream> stream) {
  std::promise<EngineLoop::Admission> verdict;
  loop.submit(std::move(specs), std::move(stream),
              [&verdict](EngineLoop::Admission admission) { verdict.set_value(std::move(admission)); });
  return verdict.get_future().get();
}

void wait_until(const std::function<bool()>& condition, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!condition()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out waiting until " << what;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

engine::RequestSpec long_request(const std::string& id) {
  engine::RequestSpec spec;
  spec.id = id;
  spec.prompt_ids = {1, 2, 3};
  spec.stop.max_tokens = 4000;  // seconds of work: it is still running when the test aborts it
  spec.stop.ignore_eos = true;
  return spec;
}

TEST(EngineLoop, RequestsFromManyThreadsEqualEachRunAlone) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  engine::Engine engine(model, nullptr, small_engine(model));
  EngineLoop loop(engine, 64);
  const std::vector<engine::RequestSpec> specs = testing::random_workload(model, 24, 7);

  constexpr int kNumThreads = 6;
  std::vector<Outputs> per_thread(kNumThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t r = size_t(t); r < specs.size(); r += kNumThreads) {
        auto stream = std::make_shared<RequestStream>(specs[r].n, 0, nullptr);
        ASSERT_EQ(submit_and_wait(loop, {specs[r]}, stream).verdict, EngineLoop::Verdict::Accepted);
        per_thread[size_t(t)].merge(drain(*stream, {specs[r]}));
      }
    });
  for (std::thread& thread : threads) thread.join();
  Outputs outputs;
  for (Outputs& part : per_thread) outputs.merge(part);
  testing::expect_bitwise_equal(testing::run_alone(model, specs), outputs);
  EXPECT_EQ(loop.counters().slots_used, 0);
  EXPECT_EQ(loop.counters().law_violations, 0);
}

TEST(EngineLoop, AbortFreesSlotsAndBlocksAtOnce) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  engine::Engine engine(model, nullptr, small_engine(model));
  EngineLoop loop(engine, 64);
  auto stream = std::make_shared<RequestStream>(1, 0, nullptr);
  ASSERT_EQ(submit_and_wait(loop, {long_request("long")}, stream).verdict, EngineLoop::Verdict::Accepted);
  wait_until([&] { return loop.counters().slots_used == 1 && loop.counters().kv_blocks_used > 0; }, "the request runs");
  loop.abort({"long"});
  wait_until([&] { return loop.counters().slots_used == 0 && loop.counters().kv_blocks_used == 0; },
             "the aborted request's slot and blocks are free");
  std::string finish_reason;
  while (!stream->is_finished())
    for (const StreamEvent& event : stream->take(kWait)) finish_reason = event.finish_reason;
  EXPECT_EQ(finish_reason, "abort");
}

TEST(EngineLoop, RefusesWhenFullAndAcceptsAgainLater) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  engine::Engine engine(model, nullptr, small_engine(model));
  EngineLoop loop(engine, 2);
  auto stream = std::make_shared<RequestStream>(2, 0, nullptr);
  ASSERT_EQ(submit_and_wait(loop, {long_request("a"), long_request("b")}, stream).verdict,
            EngineLoop::Verdict::Accepted);
  const EngineLoop::Admission refused =
      submit_and_wait(loop, {long_request("c")}, std::make_shared<RequestStream>(1, 0, nullptr));
  EXPECT_EQ(refused.verdict, EngineLoop::Verdict::Full);
  EXPECT_NE(refused.message.find("--max-num-requests 2"), std::string::npos) << refused.message;
  loop.abort({"a", "b"});
  while (!stream->is_finished()) stream->take(kWait);
  EXPECT_EQ(submit_and_wait(loop, {long_request("c")}, std::make_shared<RequestStream>(1, 0, nullptr)).verdict,
            EngineLoop::Verdict::Accepted);
}

TEST(EngineLoop, ARejectedRequestTakesBackItsSiblings) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  engine::Engine engine(model, nullptr, small_engine(model));
  EngineLoop loop(engine, 8);
  engine::RequestSpec bad = long_request("bad");
  bad.prompt_ids = {int32_t(model.config.vocab_size)};
  const EngineLoop::Admission rejected =
      submit_and_wait(loop, {long_request("good"), bad}, std::make_shared<RequestStream>(2, 0, nullptr));
  EXPECT_EQ(rejected.verdict, EngineLoop::Verdict::Rejected);
  EXPECT_NE(rejected.message.find("not a token id"), std::string::npos) << rejected.message;
  wait_until([&] { return loop.counters().slots_used == 0 && loop.counters().num_waiting == 0; },
             "the accepted sibling is taken back");
  // "good" was taken back, so its id is free again.
  auto stream = std::make_shared<RequestStream>(1, 0, nullptr);
  engine::RequestSpec good = long_request("good");
  good.stop.max_tokens = 3;
  ASSERT_EQ(submit_and_wait(loop, {good}, stream).verdict, EngineLoop::Verdict::Accepted);
  EXPECT_EQ(drain(*stream, {good}).at({"good", 0}).ids.size(), 3u);
}

TEST(EngineLoop, AStepThatThrowsKillsTheLoopLoudly) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  engine::Engine engine(model, nullptr, small_engine(model));
  EngineLoop loop(engine, 8);
  auto stream = std::make_shared<RequestStream>(1, 0, nullptr);
  ASSERT_EQ(submit_and_wait(loop, {long_request("victim")}, stream).verdict, EngineLoop::Verdict::Accepted);
  while (stream->take(kWait).empty()) {
  }
  loop.corrupt_lease_for_testing("victim");
  wait_until([&] { return stream->error().has_value(); }, "the stream gets the error");
  EXPECT_NE(stream->error()->message.find("law 2 violation"), std::string::npos) << stream->error()->message;
  EXPECT_FALSE(loop.is_alive());
  const EngineLoop::Admission refused =
      submit_and_wait(loop, {long_request("next")}, std::make_shared<RequestStream>(1, 0, nullptr));
  EXPECT_EQ(refused.verdict, EngineLoop::Verdict::Dead);
  EXPECT_NE(refused.message.find("law 2 violation"), std::string::npos) << refused.message;
}

engine::RequestSpec short_request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens) {
  engine::RequestSpec spec = long_request(id);
  spec.prompt_ids = std::move(prompt);
  spec.stop.max_tokens = max_tokens;
  return spec;
}

// On a model whose logits overflow past a sequence's first token: "bad" fails at step 1, "good" needs one position.
TEST(EngineLoop, ARequestWhoseLogitsAreNotFiniteFailsWith500AndTheLoopGoesOn) {
  testing::OneThread one_thread;
  const model::Model model = testing::overflowing_model();
  engine::EngineOptions options = small_engine(model);
  options.checked = false;
  engine::Engine engine(model, nullptr, options);
  EngineLoop loop(engine, 8);
  const engine::RequestSpec good = short_request("good", {5}, 1);
  auto bad_stream = std::make_shared<RequestStream>(1, 0, nullptr);
  auto good_stream = std::make_shared<RequestStream>(1, 0, nullptr);
  ASSERT_EQ(submit_and_wait(loop, {short_request("bad", {7}, 3)}, bad_stream).verdict, EngineLoop::Verdict::Accepted);
  ASSERT_EQ(submit_and_wait(loop, {good}, good_stream).verdict, EngineLoop::Verdict::Accepted);
  wait_until([&] { return bad_stream->error().has_value(); }, "the failed request's stream gets its error");
  EXPECT_EQ(bad_stream->error()->status, 500);
  EXPECT_EQ(bad_stream->error()->message.rfind("request 'bad' sample 0 (sequence 0), step 1: the logits are not "
                                               "finite (NaN or infinity)", 0),
            0u)
      << bad_stream->error()->message;
  EXPECT_EQ(drain(*good_stream, {good}).at({"good", 0}).ids.size(), 1u);
  EXPECT_TRUE(loop.is_alive());
  auto next_stream = std::make_shared<RequestStream>(1, 0, nullptr);
  const engine::RequestSpec next = short_request("next", {6}, 1);
  ASSERT_EQ(submit_and_wait(loop, {next}, next_stream).verdict, EngineLoop::Verdict::Accepted);
  EXPECT_EQ(drain(*next_stream, {next}).at({"next", 0}).ids.size(), 1u);
  EXPECT_EQ(loop.counters().nonfinite_rows, 1);
  EXPECT_EQ(loop.counters().slots_used, 0);
}

// The HTTP request of a failed engine request gets no answer but the error, so its other engine requests stop: here
// a long prompt still in its prefill chunks, which would otherwise reach its last chunk and fail there too.
TEST(EngineLoop, AFailedRequestStopsItsSiblings) {
  testing::OneThread one_thread;
  const model::Model model = testing::overflowing_model();
  engine::EngineOptions options = small_engine(model);
  options.checked = false;
  options.max_num_batched_tokens = 4;
  engine::Engine engine(model, nullptr, options);
  EngineLoop loop(engine, 8);
  std::vector<int32_t> long_prompt(40);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = int32_t(i % 20);
  auto stream = std::make_shared<RequestStream>(2, 0, nullptr);
  ASSERT_EQ(
      submit_and_wait(loop, {short_request("fails", {7}, 3), short_request("sibling", long_prompt, 1)}, stream).verdict,
      EngineLoop::Verdict::Accepted);
  wait_until([&] { return stream->error().has_value(); }, "the stream gets the error");
  EXPECT_EQ(stream->error()->status, 500);
  wait_until([&] { return loop.counters().num_running + loop.counters().num_waiting == 0; }, "the sibling stops");
  EXPECT_EQ(loop.counters().nonfinite_rows, 1);  // the sibling's last chunk never ran
  EXPECT_EQ(loop.counters().slots_used + loop.counters().kv_blocks_used, 0);
  EXPECT_TRUE(loop.is_alive());
}

}  // namespace
}  // namespace jambo::server
