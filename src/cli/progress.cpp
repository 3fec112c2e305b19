#include "cli/progress.h"

#include <fmt/format.h>

#include <cstdio>

namespace jambo::cli {
namespace {

std::string clock_text(double seconds) {
  const int64_t total = int64_t(seconds + 0.5);
  return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
}

}  // namespace

Progress::Progress(int64_t num_requests, bool interactive)
    : num_requests_(num_requests),
      interactive_(interactive),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::tokens_per_second(int64_t num_generated_tokens) const {
  const double elapsed = elapsed_seconds();
  return elapsed > 0 ? double(num_generated_tokens) / elapsed : 0.0;
}

void Progress::update(int64_t num_generated_tokens) {
  const auto now = std::chrono::steady_clock::now();
  const auto interval = interactive_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000);
  if (now - last_draw_ < interval) return;
  last_draw_ = now;
  draw(num_generated_tokens);
}

void Progress::finish(int64_t num_generated_tokens) {
  draw(num_generated_tokens);
  if (interactive_) std::fputc('\n', stderr);
}

void Progress::draw(int64_t num_generated_tokens) {
  constexpr int kBarWidth = 30;
  const double fraction = num_requests_ > 0 ? double(num_done_) / double(num_requests_) : 1.0;
  const int filled = int(fraction * kBarWidth);
  const double elapsed = elapsed_seconds();
  const std::string eta = num_done_ > 0 ? clock_text(elapsed / double(num_done_) * double(num_requests_ - num_done_))
                                        : std::string("?");
  fmt::print(stderr, "{}[{}{}] {}/{} requests  {:.1f} tok/s  elapsed {}  ETA {}{}", interactive_ ? "\r" : "",
             std::string(filled, '='), std::string(kBarWidth - filled, ' '), num_done_, num_requests_,
             tokens_per_second(num_generated_tokens), clock_text(elapsed), eta, interactive_ ? "" : "\n");
  std::fflush(stderr);
}

ProgressLine::ProgressLine(std::string label, std::string unit, bool interactive)
    : label_(std::move(label)), unit_(std::move(unit)), interactive_(interactive) {}

void ProgressLine::update(int64_t done, int64_t total) {
  const auto now = std::chrono::steady_clock::now();
  const auto interval = interactive_ ? std::chrono::seconds(1) : std::chrono::seconds(10);
  if (done < total && now - last_draw_ < interval) return;
  last_draw_ = now;
  fmt::print(stderr, "{}{}: {}/{} {}{}", interactive_ ? "\r" : "", label_, done, total, unit_,
             interactive_ && done < total ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace jambo::cli
