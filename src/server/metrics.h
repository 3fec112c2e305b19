// GET /metrics: the engine's counters and the server's latency histograms in Prometheus text format; and the
// periodic log line made of the same counters.
#pragma once

#include "engine/engine.h"
#include "server/request_stream.h"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace jambo::server {

// A Prometheus histogram: cumulative counts per upper bound, the sum and the count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // "# HELP", "# TYPE" and the _bucket / _sum / _count lines.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;  // [upper_bounds + 1] per bucket, the last one +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics : public LatencyObserver {
 public:
  ServerMetrics();
  void time_to_first_token(double seconds) override;
  void inter_token_latency(double seconds) override;
  void end_to_end(double seconds) override;
  void count_request(int status);  // every HTTP request answered or given up on, by status
  void count_tokens(int64_t num_prompt_tokens, int64_t num_generation_tokens);

  std::string render(const engine::EngineCounters& engine, bool engine_alive) const;

 private:
  mutable std::mutex mutex_;
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram end_to_end_;
  std::vector<std::pair<int, uint64_t>> requests_by_status_;
  int64_t num_prompt_tokens_ = 0;
  int64_t num_generation_tokens_ = 0;
};

// The server's periodic log line: prefill and decode tok/s since the previous call, and what the engine holds now.
class ThroughputLog {
 public:
  using Clock = std::chrono::steady_clock;
  ThroughputLog(const engine::EngineCounters& engine, Clock::time_point now);
  // The line for the time since the previous call; none when the engine ran no step and held no other
  // sequences, blocks or slots than at that call.
  std::optional<std::string> next(const engine::EngineCounters& engine, Clock::time_point now);

 private:
  engine::EngineCounters last_;
  Clock::time_point last_time_;
};

}  // namespace jambo::server
