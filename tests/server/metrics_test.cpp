// The server's periodic throughput line: rates over the time since the previous line, occupancy now, and silence
// while nothing happens.
#include "server/metrics.h"

#include <gtest/gtest.h>

namespace jambo::server {
namespace {

using std::chrono::milliseconds;

engine::EngineCounters idle_engine() {
  engine::EngineCounters engine;
  engine.kv_blocks_total = 1000;
  engine.slots_total = 16;
  return engine;
}

TEST(ThroughputLog, SaysNothingWhileNothingHappens) {
  const ThroughputLog::Clock::time_point start;
  ThroughputLog log(idle_engine(), start);
  EXPECT_EQ(log.next(idle_engine(), start + milliseconds(10'000)), std::nullopt);
  EXPECT_EQ(log.next(idle_engine(), start + milliseconds(20'000)), std::nullopt);
}

TEST(ThroughputLog, GivesRatesOverTheIntervalAndOccupancyNow) {
  const ThroughputLog::Clock::time_point start;
  engine::EngineCounters engine = idle_engine();
  engine.prefill_tokens = 100;
  engine.decode_tokens = 40;
  engine.steps = 7;
  ThroughputLog log(engine, start);
  engine.prefill_tokens += 500;
  engine.decode_tokens += 20;
  engine.steps += 12;
  engine.num_running = 3;
  engine.num_waiting = 2;
  engine.kv_blocks_used = 125;
  engine.slots_used = 3;
  EXPECT_EQ(log.next(engine, start + milliseconds(2000)),
            "prefill 250.0 tok/s, decode 10.0 tok/s, 3 running, 2 waiting, KV blocks 125/1000 (12.5%), "
            "state slots 3/16");
  engine.decode_tokens += 3;
  engine.steps += 1;
  EXPECT_EQ(log.next(engine, start + milliseconds(2500)),
            "prefill 0.0 tok/s, decode 6.0 tok/s, 3 running, 2 waiting, KV blocks 125/1000 (12.5%), "
            "state slots 3/16");
  EXPECT_EQ(log.next(engine, start + milliseconds(3500)), std::nullopt);
}

// An abort frees slots and blocks without a step: the next line says so.
TEST(ThroughputLog, TellsOccupancyThatMovedWithoutAStep) {
  const ThroughputLog::Clock::time_point start;
  engine::EngineCounters engine = idle_engine();
  engine.num_running = 1;
  engine.kv_blocks_used = 10;
  engine.slots_used = 1;
  ThroughputLog log(engine, start);
  const std::optional<std::string> line = log.next(idle_engine(), start + milliseconds(1000));
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("0 running, 0 waiting, KV blocks 0/1000 (0.0%), state slots 0/16"), std::string::npos) << *line;
}

}  // namespace
}  // namespace jambo::server
