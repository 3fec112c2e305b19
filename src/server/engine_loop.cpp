#include "server/engine_loop.h"

#include "backend/nonfinite_logits.h"
#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace jambo::server {

EngineLoop::EngineLoop(engine::Engine& engine, int64_t max_num_requests)
    : engine_(engine), max_num_requests_(max_num_requests) {
  engine_.set_progress_listener([this](const engine::SampleProgress& progress) { on_progress(progress); });
  counters_ = engine_.counters();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::stop() {
  std::call_once(stopped_, [this] {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    inbox_changed_.notify_all();
    thread_.join();
    engine_.set_progress_listener(nullptr);
  });
}

void EngineLoop::submit(std::vector<engine::RequestSpec> specs, std::shared_ptr<RequestStream> stream,
                        VerdictCallback on_verdict) {
  const int64_t num_requests = int64_t(specs.size());
  Admission refusal;
  {
    std::lock_guard lock(mutex_);
    if (dead_ || stopping_) {
      refusal = {Verdict::Dead, dead_ ? death_reason_ : "the server is shutting down"};
    } else if (num_unfinished_ + num_requests > max_num_requests_) {
      refusal = {Verdict::Full, fmt::format("the server holds {} requests already (--max-num-requests {}); retry later",
                                            num_unfinished_, max_num_requests_)};
    } else {
      num_unfinished_ += num_requests;
      submissions_.push_back(
          std::make_unique<Submission>(Submission{std::move(specs), std::move(stream), std::move(on_verdict)}));
    }
  }
  if (refusal.verdict != Verdict::Accepted) return on_verdict(std::move(refusal));
  inbox_changed_.notify_all();
}

void EngineLoop::abort(const std::vector<std::string>& ids) {
  {
    std::lock_guard lock(mutex_);
    aborts_.insert(aborts_.end(), ids.begin(), ids.end());
    for (const auto& submission : submissions_)
      for (const engine::RequestSpec& spec : submission->specs)
        if (std::find(ids.begin(), ids.end(), spec.id) != ids.end()) aborted_in_inbox_.insert(spec.id);
  }
  inbox_changed_.notify_all();
}

void EngineLoop::pause(PauseMode mode, std::function<void()> on_paused) {
  bool over = false;
  {
    std::lock_guard lock(mutex_);
    over = dead_ || stopping_;
    if (!over) {
      paused_ = true;
      pause_mode_ = mode;
      abort_all_ = abort_all_ || mode == PauseMode::Abort;
      on_paused_.push_back(std::move(on_paused));
      control_changed_ = true;
    }
  }
  if (over) return on_paused();
  inbox_changed_.notify_all();
}

void EngineLoop::resume() {
  std::vector<std::function<void()>> waiting;
  {
    std::lock_guard lock(mutex_);
    paused_ = false;
    waiting = std::exchange(on_paused_, {});
    control_changed_ = true;
  }
  inbox_changed_.notify_all();
  for (const auto& on_paused : waiting) on_paused();
}

bool EngineLoop::is_paused() const {
  std::lock_guard lock(mutex_);
  return paused_;
}

void EngineLoop::corrupt_lease_for_testing(const std::string& id) {
  {
    std::lock_guard lock(mutex_);
    leases_to_corrupt_.push_back(id);
  }
  inbox_changed_.notify_all();
}

void EngineLoop::change_engine(EngineChange change, ChangeDone done) {
  queue_change({std::move(change), std::move(done), /*needs_idle=*/false});
}

void EngineLoop::change_engine_when_idle(EngineChange change, ChangeDone done) {
  queue_change({std::move(change), std::move(done), /*needs_idle=*/true});
}

void EngineLoop::queue_change(Change change) {
  {
    std::unique_lock lock(mutex_);
    if (dead_ || stopping_) {
      const std::string reason = dead_ ? death_reason_ : "the server is shutting down";
      lock.unlock();
      change.done(std::make_exception_ptr(Error(reason)));
      return;
    }
    changes_.push_back(std::move(change));
  }
  inbox_changed_.notify_all();
}

bool EngineLoop::is_alive() const {
  std::lock_guard lock(mutex_);
  return !dead_;
}

std::string EngineLoop::death_reason() const {
  std::lock_guard lock(mutex_);
  return death_reason_;
}

engine::EngineCounters EngineLoop::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void EngineLoop::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    control_changed_ = false;
    take_inbox(lock);
    if (paused_) settle_pause(lock);
    const engine::Engine::Sleep asleep = engine_.sleeping();  // its requests wait for the wake
    const bool frozen = (paused_ && pause_mode_ != PauseMode::Wait) || asleep.weights || asleep.caches;
    if (!engine_.has_unfinished() || frozen) {
      inbox_changed_.wait(lock, [this] {
        return stopping_ || control_changed_ || (!paused_ && !submissions_.empty()) || !aborts_.empty() ||
               !leases_to_corrupt_.empty() || !changes_.empty();
      });
      continue;
    }
    lock.unlock();
    std::string failure;
    try {
      engine_.step();
    } catch (const backend::NonFiniteLogits&) {
      abort_failed_requests();  // the step went on without the requests that failed; so does the loop
    } catch (const std::exception& error) {
      failure = error.what();
    }
    engine::EngineCounters counters = engine_.counters();
    lock.lock();
    counters_ = counters;
    if (!failure.empty()) return die(lock, failure);
    lock.unlock();
    notify_stepped();  // after the counters: a client that saw its tokens sees the step in /metrics
    lock.lock();
  }
  refuse_all(lock, "the server is shutting down");
}

// Runs with the lock held on entry and exit; the engine is touched without it.
// While paused, or while a change waits for the engine to be idle, submissions stay in the inbox.
void EngineLoop::take_inbox(std::unique_lock<std::mutex>& lock) {
  std::vector<std::string> aborts = std::exchange(aborts_, {});
  std::vector<std::string> leases_to_corrupt = std::exchange(leases_to_corrupt_, {});
  std::vector<Change> changes = std::exchange(changes_, {});
  const bool abort_all = std::exchange(abort_all_, false);
  const bool frozen = paused_ && pause_mode_ != PauseMode::Wait;
  if (aborts.empty() && leases_to_corrupt.empty() && changes.empty() && !abort_all &&
      changes_waiting_for_idle_.empty() && (paused_ || submissions_.empty()))
    return;
  lock.unlock();
  if (abort_all)
    for (const auto& [id, route] : routes_) aborts.push_back(id);
  for (const std::string& id : aborts)
    if (routes_.contains(id)) engine_.abort_request(id);
  for (const std::string& id : leases_to_corrupt) engine_.corrupt_lease_for_testing(id);
  run_changes(changes, frozen);  // after the aborts: a change that needs the engine idle finds those requests gone
  lock.lock();
  std::vector<std::unique_ptr<Submission>> submissions;
  if (!paused_ && changes_waiting_for_idle_.empty()) submissions = std::exchange(submissions_, {});
  lock.unlock();
  std::vector<int64_t> num_rejected;
  for (auto& submission : submissions) {
    Admission admission = admit(*submission);
    num_rejected.push_back(admission.verdict == Verdict::Accepted ? 0 : int64_t(submission->specs.size()));
    submission->on_verdict(std::move(admission));
  }
  const engine::EngineCounters counters = engine_.counters();
  lock.lock();
  for (int64_t count : num_rejected) num_unfinished_ -= count;
  counters_ = counters;
  lock.unlock();
  notify_stepped();  // the aborted requests' streams, after the counters (as after a step)
  lock.lock();
}

// Runs the changes in the order they came; those that need the engine idle wait, in order, until no request runs
// or the requests are frozen (they then find them, and say so if they cannot run beside them).
void EngineLoop::run_changes(std::vector<Change>& changes, bool frozen) {
  for (Change& change : changes) {
    if (change.needs_idle || !changes_waiting_for_idle_.empty())
      changes_waiting_for_idle_.push_back(std::move(change));
    else
      run_change(change);
  }
  const engine::Engine::Sleep asleep = engine_.sleeping();
  if (changes_waiting_for_idle_.empty() ||
      (engine_.has_unfinished() && !frozen && !asleep.weights && !asleep.caches))
    return;
  for (const Change& change : std::exchange(changes_waiting_for_idle_, {})) run_change(change);
}

void EngineLoop::run_change(const Change& change) {
  std::exception_ptr thrown;
  try {
    change.change(engine_);
  } catch (...) {
    thrown = std::current_exception();
  }
  change.done(thrown);
}

// Runs with the lock held on entry and exit: the pauses waiting are told once theirs holds.
void EngineLoop::settle_pause(std::unique_lock<std::mutex>& lock) {
  if (on_paused_.empty() || (pause_mode_ == PauseMode::Wait && engine_.has_unfinished())) return;
  std::vector<std::function<void()>> holding = std::exchange(on_paused_, {});
  lock.unlock();
  for (const auto& on_paused : holding) on_paused();
  lock.lock();
}

// All of a submission's requests or none: one the engine refuses (bad input) or fails on (a bug) takes back those
// added before it.
EngineLoop::Admission EngineLoop::admit(Submission& submission) {
  std::vector<std::string> aborted;  // while the submission waited in the inbox: taken out whatever the verdict
  {
    std::lock_guard lock(mutex_);
    for (const engine::RequestSpec& spec : submission.specs)
      if (aborted_in_inbox_.erase(spec.id) > 0) aborted.push_back(spec.id);
  }
  std::vector<std::string> added;
  int64_t first_choice = 0;
  try {
    for (const engine::RequestSpec& spec : submission.specs) {
      engine_.add_request(spec);
      added.push_back(spec.id);
      routes_[spec.id] = Route{submission.stream, first_choice, spec.n, 0};
      first_choice += spec.n;
    }
    for (const std::string& id : aborted) engine_.abort_request(id);
  } catch (const std::exception& error) {
    for (const std::string& id : added) {
      routes_.erase(id);
      engine_.abort_request(id);
    }
    if (dynamic_cast<const Error*>(&error)) return {Verdict::Rejected, error.what()};
    return {Verdict::Failed, error.what(), std::current_exception()};
  }
  return {};
}

void EngineLoop::on_progress(const engine::SampleProgress& progress) {
  const auto found = routes_.find(progress.output.id);
  if (found == routes_.end()) return;  // taken back before it was accepted
  Route& route = found->second;
  route.stream->on_progress(route.first_choice + progress.output.sample, progress);
  if (stepped_.empty() || stepped_.back() != route.stream) stepped_.push_back(route.stream);
  if (!progress.finished || ++route.num_finished < route.num_samples) return;
  routes_.erase(found);
  std::lock_guard lock(mutex_);
  --num_unfinished_;
}

void EngineLoop::notify_stepped() {
  std::sort(stepped_.begin(), stepped_.end());
  stepped_.erase(std::unique(stepped_.begin(), stepped_.end()), stepped_.end());
  for (const auto& stream : std::exchange(stepped_, {})) stream->notify();
}

// An HTTP request one of whose samples failed gets no answer but its error: its other engine requests stop too.
void EngineLoop::abort_failed_requests() {
  std::vector<std::string> ids;
  for (const auto& [id, route] : routes_)
    if (route.stream->error()) ids.push_back(id);
  for (const std::string& id : ids) engine_.abort_request(id);
}

void EngineLoop::die(std::unique_lock<std::mutex>& lock, const std::string& reason) {
  dead_ = true;
  death_reason_ = fmt::format("the engine loop stopped: {}", reason);
  num_unfinished_ = 0;
  refuse_all(lock, death_reason_);
}

// Every open stream fails, every submission waiting in the inbox is refused and every pause waiting is told, the lock
// released for their callbacks.
void EngineLoop::refuse_all(std::unique_lock<std::mutex>& lock, const std::string& reason) {
  std::vector<std::unique_ptr<Submission>> submissions = std::exchange(submissions_, {});
  std::vector<std::function<void()>> pauses = std::exchange(on_paused_, {});
  std::vector<Change> changes = std::exchange(changes_, {});
  for (Change& change : std::exchange(changes_waiting_for_idle_, {})) changes.push_back(std::move(change));
  aborted_in_inbox_.clear();
  lock.unlock();
  for (const auto& on_paused : pauses) on_paused();
  for (const Change& change : changes) change.done(std::make_exception_ptr(Error(reason)));
  for (const auto& [id, route] : routes_) {
    route.stream->fail({503, reason});
    route.stream->notify();
  }
  routes_.clear();
  for (auto& submission : submissions) submission->on_verdict({Verdict::Dead, reason});
}

}  // namespace jambo::server
