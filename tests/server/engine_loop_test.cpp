// The server's engine loop: requests from many threads at once come out as if run alone (law 5),
// aborts free slots and blocks at once, a full loop refuses, a request whose logits are not finite fails alone
// (500), a dying loop fails every stream loudly, pauses in their three modes hold new requests until resumed, and
// changes of the engine (a weight update) run between steps, those that need it idle (a sleep) once it is.
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

// A pause's callback, as a caller that waits for it sees it (shared: it may come after the caller gave up).
struct PauseSignal {
  std::shared_ptr<std::promise<void>> held = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = held->get_future().share();
  std::function<void()> callback() const {
    return [held = held] { held->set_value(); };
  }
  bool holds_within(std::chrono::milliseconds timeout) const {
    return future.wait_for(timeout) == std::future_status::ready;
  }
};

// A loop over the fixture model's engine, for the pause tests.
struct PausableLoop {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  engine::Engine engine{model, nullptr, small_engine(model)};
  EngineLoop loop{engine, 64};

  // Pauses, and says whether the pause held within 30 s.
  bool pause(EngineLoop::PauseMode mode) {
    PauseSignal signal;
    loop.pause(mode, signal.callback());
    return signal.holds_within(std::chrono::seconds(30));
  }
  // Submits one request and waits for its admission.
  std::shared_ptr<RequestStream> start(const engine::RequestSpec& spec) {
    auto stream = std::make_shared<RequestStream>(1, 0, nullptr);
    EXPECT_EQ(submit_and_wait(loop, {spec}, stream).verdict, EngineLoop::Verdict::Accepted);
    return stream;
  }
};

// A submission whose verdict arrives later (the loop is paused).
struct PendingSubmission {
  std::promise<EngineLoop::Admission> verdict;
  std::future<EngineLoop::Admission> future = verdict.get_future();
  bool decided_within(std::chrono::milliseconds timeout) {
    return future.wait_for(timeout) == std::future_status::ready;
  }
};

void submit_later(EngineLoop& loop, std::vector<engine::RequestSpec> specs, std::shared_ptr<RequestStream> stream,
                  PendingSubmission& pending) {
  loop.submit(std::move(specs), std::move(stream),
              [&pending](EngineLoop::Admission admission) { pending.verdict.set_value(std::move(admission)); });
}

// Abort: the running request ends at once with "abort" and its tokens so far; a request sent while paused waits,
// neither admitted nor refused, and runs after resume as it would have alone.
TEST(EngineLoop, PauseInAbortModeEndsTheRunningAndHoldsTheNewUntilResume) {
  PausableLoop p;
  const std::shared_ptr<RequestStream> running = p.start(long_request("long"));
  wait_until([&] { return p.loop.counters().decode_tokens > 0; }, "the request generates");
  ASSERT_TRUE(p.pause(EngineLoop::PauseMode::Abort));
  EXPECT_TRUE(p.loop.is_paused());
  const engine::SampleOutput aborted = drain(*running, {long_request("long")}).at({"long", 0});
  EXPECT_EQ(aborted.finish_reason, "abort");
  EXPECT_FALSE(aborted.ids.empty());
  wait_until([&] { return p.loop.counters().slots_used + p.loop.counters().kv_blocks_used == 0; },
             "the aborted request's slot and blocks are free");

  const engine::RequestSpec later = short_request("later", {4, 5, 6}, 5);
  auto later_stream = std::make_shared<RequestStream>(1, 0, nullptr);
  PendingSubmission pending;
  submit_later(p.loop, {later}, later_stream, pending);
  EXPECT_FALSE(pending.decided_within(std::chrono::milliseconds(300)));
  EXPECT_EQ(p.loop.counters().num_running + p.loop.counters().num_waiting, 0);
  p.loop.resume();
  EXPECT_FALSE(p.loop.is_paused());
  ASSERT_TRUE(pending.decided_within(std::chrono::seconds(30)));
  EXPECT_EQ(pending.future.get().verdict, EngineLoop::Verdict::Accepted);
  testing::expect_bitwise_equal(testing::run_alone(p.model, {later}), drain(*later_stream, {later}));
}

// Wait: the running request finishes as it would have; the pause holds once it has.
TEST(EngineLoop, PauseInWaitModeHoldsOnceTheRunningRequestsFinish) {
  PausableLoop p;
  const engine::RequestSpec spec = short_request("finishing", {1, 2, 3}, 24);
  const std::shared_ptr<RequestStream> stream = p.start(spec);
  ASSERT_TRUE(p.pause(EngineLoop::PauseMode::Wait));
  EXPECT_EQ(p.loop.counters().num_running + p.loop.counters().num_waiting, 0);
  testing::expect_bitwise_equal(testing::run_alone(p.model, {spec}), drain(*stream, {spec}));
  p.loop.resume();
}

// Keep: the running request is frozen in place, its slot and blocks kept and no step taken, and after resume it
// ends exactly as it would have without the pause. A request aborted while it waits in the inbox ends with "abort"
// once admitted, with no tokens.
TEST(EngineLoop, PauseInKeepModeFreezesRequestsAndResumeContinuesThemBitwise) {
  PausableLoop p;
  const engine::RequestSpec spec = short_request("frozen", {7, 8, 9}, 60);
  const std::shared_ptr<RequestStream> stream = p.start(spec);
  wait_until([&] { return p.loop.counters().decode_tokens > 0; }, "the request generates");
  ASSERT_TRUE(p.pause(EngineLoop::PauseMode::Keep));
  const engine::EngineCounters at_pause = p.loop.counters();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(p.loop.counters().steps, at_pause.steps);
  EXPECT_EQ(p.loop.counters().slots_used, 1);
  EXPECT_GT(p.loop.counters().kv_blocks_used, 0);

  const engine::RequestSpec doomed = short_request("doomed", {1}, 5);
  auto doomed_stream = std::make_shared<RequestStream>(1, 0, nullptr);
  PendingSubmission pending;
  submit_later(p.loop, {doomed}, doomed_stream, pending);
  p.loop.abort({"doomed"});
  p.loop.resume();
  testing::expect_bitwise_equal(testing::run_alone(p.model, {spec}), drain(*stream, {spec}));
  ASSERT_TRUE(pending.decided_within(std::chrono::seconds(30)));
  const engine::SampleOutput ended = drain(*doomed_stream, {doomed}).at({"doomed", 0});
  EXPECT_EQ(ended.finish_reason, "abort");
  EXPECT_TRUE(ended.ids.empty());
  // A stream may hold its last event before the step that produced it has ended.
  wait_until([&] { return p.loop.counters().slots_used + p.loop.counters().kv_blocks_used == 0; },
             "the slots and blocks are free");
}

// A pause asked of a stopped loop is told at once; one waiting when the loop stops is told then.
TEST(EngineLoop, APauseIsToldWhenTheLoopStops) {
  PausableLoop p;
  p.start(long_request("long"));
  PauseSignal waiting;
  p.loop.pause(EngineLoop::PauseMode::Wait, waiting.callback());  // the long request would take seconds
  p.loop.stop();
  EXPECT_TRUE(waiting.holds_within(std::chrono::seconds(5)));
  PauseSignal after;
  p.loop.pause(EngineLoop::PauseMode::Keep, after.callback());
  EXPECT_TRUE(after.holds_within(std::chrono::milliseconds(0)));
}

// The outcome of a change of the engine, as change_engine's caller waits for it.
enum class When { BetweenSteps, Idle };
std::future<std::exception_ptr> change(EngineLoop& loop, EngineLoop::EngineChange what,
                                       When when = When::BetweenSteps) {
  auto done = std::make_shared<std::promise<std::exception_ptr>>();
  std::future<std::exception_ptr> future = done->get_future();
  EngineLoop::ChangeDone tell = [done](std::exception_ptr thrown) { done->set_value(thrown); };
  if (when == When::Idle)
    loop.change_engine_when_idle(std::move(what), std::move(tell));
  else
    loop.change_engine(std::move(what), std::move(tell));
  return future;
}

// A change of the engine runs on the loop's thread between steps, while requests run and while paused, and says what
// it threw; a loop that stopped refuses one at once.
TEST(EngineLoop, AChangeOfTheEngineRunsBetweenStepsAndSaysWhatItThrew) {
  PausableLoop p;
  const std::shared_ptr<RequestStream> running = p.start(long_request("long"));
  wait_until([&] { return p.loop.counters().decode_tokens > 0; }, "the request generates");
  std::thread::id ran_on;
  auto renamed = change(p.loop, [&](engine::Engine& engine) {
    ran_on = std::this_thread::get_id();
    engine.set_weight_version("renamed");
  });
  ASSERT_EQ(renamed.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(renamed.get(), nullptr);
  EXPECT_NE(ran_on, std::this_thread::get_id());

  ASSERT_TRUE(p.pause(EngineLoop::PauseMode::Keep));
  auto thrown = change(p.loop, [](engine::Engine&) { throw Error("no such update"); });
  ASSERT_EQ(thrown.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const std::exception_ptr error = thrown.get();
  ASSERT_NE(error, nullptr);
  EXPECT_THROW(std::rethrow_exception(error), Error);
  p.loop.resume();
  const engine::SampleOutput finished = drain(*running, {long_request("long")}).at({"long", 0});
  EXPECT_EQ(finished.finish_reason, "length");

  p.loop.stop();
  auto refused = change(p.loop, [](engine::Engine&) { ADD_FAILURE() << "a stopped loop ran a change"; });
  ASSERT_EQ(refused.wait_for(std::chrono::milliseconds(0)), std::future_status::ready);
  EXPECT_NE(refused.get(), nullptr);
}

// A change that needs the engine idle (a sleep) runs once the running request has finished as it would have alone;
// a request sent meanwhile waits in the inbox and runs after it. No pause is set or lifted: a client's own pause,
// asked while the change waited, still holds after it.
TEST(EngineLoop, AChangeThatNeedsTheEngineIdleWaitsForTheRunningAndHoldsTheNew) {
  PausableLoop p;
  const engine::RequestSpec running = short_request("running", {1, 2, 3}, 60);
  const std::shared_ptr<RequestStream> running_stream = p.start(running);
  wait_until([&] { return p.loop.counters().decode_tokens > 0; }, "the request generates");
  const engine::RequestSpec later = short_request("later", {4, 5, 6}, 5);
  auto later_stream = std::make_shared<RequestStream>(1, 0, nullptr);
  PendingSubmission pending;
  bool idle = false, later_admitted = true;
  auto slept = change(
      p.loop,
      [&](engine::Engine& engine) {
        idle = !engine.has_unfinished();
        later_admitted = pending.decided_within(std::chrono::milliseconds(0));
      },
      When::Idle);
  submit_later(p.loop, {later}, later_stream, pending);
  ASSERT_EQ(slept.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(slept.get(), nullptr);
  EXPECT_TRUE(idle);
  EXPECT_FALSE(later_admitted);
  EXPECT_FALSE(p.loop.is_paused());
  testing::expect_bitwise_equal(testing::run_alone(p.model, {running}), drain(*running_stream, {running}));
  ASSERT_TRUE(pending.decided_within(std::chrono::seconds(30)));
  EXPECT_EQ(pending.future.get().verdict, EngineLoop::Verdict::Accepted);
  testing::expect_bitwise_equal(testing::run_alone(p.model, {later}), drain(*later_stream, {later}));

  const std::shared_ptr<RequestStream> second = p.start(short_request("second", {7, 8}, 40));
  auto waits = change(p.loop, [](engine::Engine&) {}, When::Idle);
  PauseSignal client_pause;
  p.loop.pause(EngineLoop::PauseMode::Wait, client_pause.callback());
  ASSERT_EQ(waits.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(client_pause.holds_within(std::chrono::seconds(30)));
  EXPECT_TRUE(p.loop.is_paused());
  p.loop.resume();
}

// Where the requests are frozen (a pause in keep mode), a change that needs the engine idle runs at once and finds
// them: a sleep then says it cannot run beside them.
TEST(EngineLoop, AChangeThatNeedsTheEngineIdleFindsFrozenRequests) {
  PausableLoop p;
  const std::shared_ptr<RequestStream> frozen = p.start(long_request("long"));
  wait_until([&] { return p.loop.counters().decode_tokens > 0; }, "the request generates");
  ASSERT_TRUE(p.pause(EngineLoop::PauseMode::Keep));
  auto sleep = change(p.loop, [](engine::Engine& engine) { engine.sleep(backend::SleepLevel::KeepWeights); },
                      When::Idle);
  ASSERT_EQ(sleep.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const std::exception_ptr error = sleep.get();
  ASSERT_NE(error, nullptr);
  EXPECT_THROW(std::rethrow_exception(error), Error);
  EXPECT_TRUE(p.loop.is_paused());
  p.loop.abort({"long"});
  p.loop.resume();
}

}  // namespace
}  // namespace jambo::server
