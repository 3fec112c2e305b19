#include "server/request_stream.h"

#include "core/error.h"
#include "engine/sequence_sampler.h"

#include <utility>

namespace jambo::server {

namespace {

double seconds_between(RequestStream::Clock::time_point from, RequestStream::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

RequestStream::RequestStream(int64_t num_choices, size_t max_stop_length, LatencyObserver* latency)
    : choices_(size_t(num_choices)), max_stop_length_(max_stop_length), latency_(latency) {}

void RequestStream::set_listener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

void RequestStream::on_progress(int64_t choice_index, const engine::SampleProgress& progress) {
  if (!progress.output.error.empty()) return fail({500, progress.output.error});
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  Choice& choice = choices_.at(size_t(choice_index));
  JAMBO_ASSERT(!choice.finished);
  const engine::SampleOutput& output = progress.output;
  StreamEvent event;
  event.choice = choice_index;
  if (!choice.started) {
    choice.started = true;
    event.prompt.emplace();
    event.prompt->prompt_ids = output.prompt_ids;
    event.prompt->prompt_logprobs = output.prompt_logprobs;
    event.prompt->prompt_top_logprobs = output.prompt_top_logprobs;
  }
  for (size_t i = choice.num_ids_sent; i < output.ids.size(); ++i) {
    event.ids.push_back(output.ids[i]);
    event.logprobs.push_back(output.logprobs[i]);
    event.top_logprobs.push_back(output.top_logprobs[i]);
  }
  choice.num_ids_sent = output.ids.size();
  // A stop string can only cut text that was held back, so what was sent stays a prefix of the text.
  JAMBO_ASSERT(progress.text.size() >= choice.num_text_bytes_sent);
  const size_t text_length = std::max(engine::stable_text_length(progress.text, progress.finished, max_stop_length_),
                                      choice.num_text_bytes_sent);
  event.text = progress.text.substr(choice.num_text_bytes_sent, text_length - choice.num_text_bytes_sent);
  choice.num_text_bytes_sent = text_length;

  if (!event.ids.empty() && latency_) {
    if (!saw_first_token_) latency_->time_to_first_token(seconds_between(arrival_, now));
    if (choice.last_token_time) latency_->inter_token_latency(seconds_between(*choice.last_token_time, now));
  }
  if (!event.ids.empty()) {
    saw_first_token_ = true;
    choice.last_token_time = now;
  }
  if (progress.finished) {
    event.finish_reason = output.finish_reason;
    event.weight_versions = output.weight_versions;
    event.prompt_routed_experts = output.prompt_routed_experts;
    event.routed_experts = output.routed_experts;
    choice.finished = true;
    if (++num_finished_ == int64_t(choices_.size()) && latency_) latency_->end_to_end(seconds_between(arrival_, now));
  }
  pending_.push_back(std::move(event));
  changed_.notify_all();
}

void RequestStream::notify() {
  std::unique_lock lock(mutex_);
  const std::function<void()> listener = listener_;
  lock.unlock();
  if (listener) listener();
}

void RequestStream::fail(StreamError error) {
  std::lock_guard lock(mutex_);
  if (!error_) error_ = std::move(error);
  changed_.notify_all();
}

std::vector<StreamEvent> RequestStream::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [this] { return !pending_.empty() || error_.has_value(); });
  return std::exchange(pending_, {});
}

bool RequestStream::is_finished() const {
  std::lock_guard lock(mutex_);
  return pending_.empty() && num_finished_ == int64_t(choices_.size());
}

std::optional<StreamError> RequestStream::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

}  // namespace jambo::server
