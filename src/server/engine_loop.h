// The one engine loop shared by every HTTP connection: a thread that owns the Engine, takes requests
// and aborts from an inbox between steps, steps while there is work, and routes each sample's
// progress to its HTTP request's stream. A request whose logits are not finite fails alone: its stream gets the
// error (500) and the loop goes on. If a step throws anything else, the loop dies loudly: every open stream gets
// the error and /health turns 503.
#pragma once

#include "engine/engine.h"
#include "server/request_stream.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace jambo::server {

class EngineLoop {
 public:
  // max_num_requests bounds the engine requests accepted and not yet finished (running or waiting).
  EngineLoop(engine::Engine& engine, int64_t max_num_requests);
  ~EngineLoop();  // stop()

  // Fails every open stream ("the server is shutting down") and joins the thread; idempotent, and safe
  // from several threads.
  void stop();

  // Rejected: the engine refused a request as bad input (jambo::Error). Failed: adding one threw anything else,
  // a bug in jambo.
  enum class Verdict { Accepted, Rejected, Failed, Full, Dead };
  struct Admission {
    Verdict verdict = Verdict::Accepted;
    std::string message;                 // why, when not accepted
    std::exception_ptr error = nullptr;  // what the engine threw, when failed
  };
  using VerdictCallback = std::function<void(Admission)>;
  // The engine requests of one HTTP request, accepted all together or not at all. The stream's choice
  // c*n + s is sample s of specs[c]. Returns at once; on_verdict is called once, without the loop's lock: at once
  // when the loop is full, dead or stopping, else on the loop's thread when it takes them (within a step).
  void submit(std::vector<engine::RequestSpec> specs, std::shared_ptr<RequestStream> stream,
              VerdictCallback on_verdict);
  // Aborts whichever of these requests is unfinished; frees their slots and KV blocks at the next turn. A request
  // still waiting in the inbox (the loop is paused) ends with "abort" as soon as it is admitted.
  void abort(const std::vector<std::string>& ids);

  // Pausing, as vLLM's /pause names the modes: Abort ends every unfinished request at once (finish_reason "abort",
  // with the output so far); Wait lets the running requests finish; Keep freezes them where they are, state and KV
  // blocks kept, to go on after resume(). Meanwhile requests that arrive wait in the inbox, neither admitted nor
  // refused. on_paused is called once: on the loop's thread when the pause holds (the aborts done, the last running
  // request finished, or the step under way ended), or by resume() or stop() when those come first, or at once
  // when the loop is dead.
  enum class PauseMode { Abort, Wait, Keep };
  void pause(PauseMode mode, std::function<void()> on_paused);
  void resume();
  bool is_paused() const;

  // Runs `change` on the loop's thread between steps, paused or not, then `done` with what it threw (null when
  // nothing): changes of the engine itself, such as a weight update. done is called at once with the reason where
  // the loop is dead or stopping.
  using EngineChange = std::function<void(engine::Engine&)>;
  using ChangeDone = std::function<void(std::exception_ptr)>;
  void change_engine(EngineChange change, ChangeDone done);
  // The same, for a change that needs no request running (a sleep): meanwhile the running requests go on to their
  // end and new ones wait in the inbox, as in a pause in wait mode, but no pause is set or lifted, so a client's own
  // pause holds before and after. Where requests are frozen (a pause in abort or keep mode, or the engine asleep),
  // the change runs at the next turn and finds them there.
  void change_engine_when_idle(EngineChange change, ChangeDone done);

  bool is_alive() const;
  std::string death_reason() const;
  engine::EngineCounters counters() const;  // as of the last step

  // Test-only: Engine::corrupt_lease_for_testing(id) on the loop's thread (a law 2 violation in checked
  // mode, to show that the loop dies loudly).
  void corrupt_lease_for_testing(const std::string& id);

 private:
  struct Submission {
    std::vector<engine::RequestSpec> specs;
    std::shared_ptr<RequestStream> stream;
    VerdictCallback on_verdict;
  };
  struct Change {
    EngineChange change;
    ChangeDone done;
    bool needs_idle = false;
  };
  struct Route {
    std::shared_ptr<RequestStream> stream;
    int64_t first_choice = 0;
    int64_t num_samples = 0;
    int64_t num_finished = 0;
  };

  void run();
  void queue_change(Change change);
  void take_inbox(std::unique_lock<std::mutex>& lock);
  void run_changes(std::vector<Change>& changes, bool frozen);
  void run_change(const Change& change);
  Admission admit(Submission& submission);
  void on_progress(const engine::SampleProgress& progress);
  void notify_stepped();
  void abort_failed_requests();
  void settle_pause(std::unique_lock<std::mutex>& lock);
  void die(std::unique_lock<std::mutex>& lock, const std::string& reason);
  void refuse_all(std::unique_lock<std::mutex>& lock, const std::string& reason);

  engine::Engine& engine_;
  const int64_t max_num_requests_;
  std::unordered_map<std::string, Route> routes_;        // unfinished engine requests; engine thread only
  std::vector<std::shared_ptr<RequestStream>> stepped_;  // the streams the current step gave news; engine thread only
  std::vector<Change> changes_waiting_for_idle_;         // engine thread only; new requests wait in the inbox meanwhile

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable inbox_changed_;
  std::vector<std::unique_ptr<Submission>> submissions_;
  std::vector<std::string> aborts_;
  std::vector<std::string> leases_to_corrupt_;
  std::vector<Change> changes_;
  std::unordered_set<std::string> aborted_in_inbox_;  // ids of waiting submissions to abort once admitted
  bool paused_ = false;
  PauseMode pause_mode_ = PauseMode::Abort;
  bool abort_all_ = false;                         // a pause in Abort mode: every unfinished request, next turn
  std::vector<std::function<void()>> on_paused_;   // the pauses not yet holding
  bool control_changed_ = false;                   // pause() or resume() since the loop last looked
  int64_t num_unfinished_ = 0;  // engine requests accepted or waiting in the inbox, not finished
  bool stopping_ = false;
  bool dead_ = false;
  std::string death_reason_;
  engine::EngineCounters counters_;

  std::once_flag stopped_;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace jambo::server
