// A progress line on stderr for long runs: requests done, generated tokens/s and time left. On a
// terminal it redraws one line; otherwise it prints a line every few seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace jambo::cli {

class Progress {
 public:
  Progress(int64_t num_requests, bool interactive);

  void request_done() { ++num_done_; }
  void update(int64_t num_generated_tokens);  // cheap; redraws at most a few times a second
  void finish(int64_t num_generated_tokens);

  double elapsed_seconds() const;
  double tokens_per_second(int64_t num_generated_tokens) const;

 private:
  void draw(int64_t num_generated_tokens);

  int64_t num_requests_;
  int64_t num_done_ = 0;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// A plainer line for the phases of compare and stress: "label: 12/100 unit", redrawn at most once a second on
// a terminal, else printed every 10 seconds, and always once at the end (done == total).
class ProgressLine {
 public:
  ProgressLine(std::string label, std::string unit, bool interactive);
  void update(int64_t done, int64_t total);

 private:
  std::string label_;
  std::string unit_;
  bool interactive_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace jambo::cli
