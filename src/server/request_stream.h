// What one HTTP request sees of its samples ("choices"): the engine loop pushes each sample's new
// tokens and text as they come; the HTTP thread takes them, to stream them or to wait for the end.
#pragma once

#include "engine/engine.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace jambo::server {

// One choice's news since its previous event.
struct StreamEvent {
  int64_t choice = 0;
  std::vector<int32_t> ids;                             // [new tokens]
  std::vector<double> logprobs;                         // [new tokens]
  std::vector<std::vector<backend::TokenLogprob>> top_logprobs;  // [new tokens][K]
  std::string text;                                     // new text
  std::string finish_reason;                            // "" until the choice ends
  // Set on a choice's first event only: the prompt (its logprobs when they were asked for).
  std::optional<engine::SampleOutput> prompt;
  // Set on a choice's last event only: which weights sampled which of its tokens, and where asked, the experts its
  // tokens were routed to (engine::SampleOutput).
  std::vector<engine::WeightVersionSpan> weight_versions;
  std::vector<engine::TokenRouting> prompt_routed_experts, routed_experts;
};

// Why a request gets no answer, with the HTTP status that says so.
struct StreamError {
  int status = 503;  // 503: the engine loop died or the server stops; 500: a choice failed (logits not finite)
  std::string message;
};

// Latencies of one request, as the server's metrics want them.
struct LatencyObserver {
  virtual ~LatencyObserver() = default;
  virtual void time_to_first_token(double seconds) = 0;
  virtual void inter_token_latency(double seconds) = 0;
  virtual void end_to_end(double seconds) = 0;
};

class RequestStream {
 public:
  using Clock = std::chrono::steady_clock;

  // max_stop_length: the longest stop string; that much text minus one byte is held back until the
  // choice ends, since a stop string may still begin inside it and cut it off.
  RequestStream(int64_t num_choices, size_t max_stop_length, LatencyObserver* latency);

  // Engine loop side. A choice that failed (its sample's error) fails the whole request with status 500.
  void on_progress(int64_t choice, const engine::SampleProgress& progress);
  void fail(StreamError error);  // the first error stays

  // Calls the listener (set by the HTTP side): the loop calls it after the step that gave the stream events or an
  // error, once /metrics shows that step, and after failing it otherwise.
  void notify();

  // HTTP side: the listener runs on the engine loop's thread, without the stream's lock (an asynchronous connection
  // polls take() then).
  void set_listener(std::function<void()> listener);
  // The events since the last call, after waiting up to `timeout` for one.
  std::vector<StreamEvent> take(std::chrono::milliseconds timeout);
  bool is_finished() const;                  // every choice ended and every event was taken
  std::optional<StreamError> error() const;  // why there is no answer

 private:
  struct Choice {
    bool started = false;
    size_t num_ids_sent = 0;
    size_t num_text_bytes_sent = 0;
    bool finished = false;
    std::optional<Clock::time_point> last_token_time;
  };

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Choice> choices_;  // [num_choices]
  int64_t num_finished_ = 0;
  size_t max_stop_length_;
  LatencyObserver* latency_;
  Clock::time_point arrival_ = Clock::now();
  bool saw_first_token_ = false;
  std::vector<StreamEvent> pending_;
  std::optional<StreamError> error_;
  std::function<void()> listener_;
};

}  // namespace jambo::server
