#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace jambo::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket =
      size_t(std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string text = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t b = 0; b < upper_bounds_.size(); ++b) {
    cumulative += counts_[b];
    text += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, upper_bounds_[b], cumulative);
  }
  text += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return text;
}

namespace {

std::string metric(const char* name, const char* type, const char* help, int64_t value) {
  return fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

// vLLM's names for the queries and hits, in tokens; the misses by reason, in queries. Without prefix caching, none.
std::string render_prefix_cache(const engine::EngineCounters& engine) {
  if (!engine.prefix_caching) return "";
  const engine::PrefixCacheCounters& cache = engine.prefix_cache;
  std::string text;
  text += metric("jambo_prefix_cache_queries_total", "counter", "prompt tokens of the requests that looked up a prefix",
                 cache.query_tokens);
  text += metric("jambo_prefix_cache_hits_total", "counter", "of those, the tokens resumed from the cache",
                 cache.hit_tokens);
  text +=
      "# HELP jambo_prefix_cache_misses_total lookups that found nothing to resume from, by reason\n"
      "# TYPE jambo_prefix_cache_misses_total counter\n";
  for (int reason = 0; reason < engine::kNumPrefixMisses; ++reason)
    text += fmt::format("jambo_prefix_cache_misses_total{{reason=\"{}\"}} {}\n",
                        engine::name(engine::PrefixMiss(reason)), cache.misses[reason]);
  text += metric("jambo_prefix_cache_checkpoints_used", "gauge", "recurrent-state checkpoints holding a cached prefix",
                 cache.checkpoints_used);
  text += metric("jambo_prefix_cache_checkpoints_total", "gauge", "recurrent-state checkpoints in the pool",
                 cache.checkpoints_total);
  text += metric("jambo_prefix_cache_checkpoint_evictions_total", "counter",
                 "checkpoints evicted, least recently used first", cache.checkpoint_evictions);
  text += metric("jambo_prefix_cache_kv_blocks", "gauge", "KV blocks the cache holds (some shared with requests)",
                 cache.cached_kv_blocks);
  text += metric("jambo_prefix_cache_kv_block_evictions_total", "counter",
                 "cached KV blocks evicted to make room", cache.kv_block_evictions);
  return text;
}

}  // namespace

ServerMetrics::ServerMetrics()
    : time_to_first_token_(
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      inter_token_latency_(
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}),
      end_to_end_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480}) {}

void ServerMetrics::time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void ServerMetrics::inter_token_latency(double seconds) {
  std::lock_guard lock(mutex_);
  inter_token_latency_.observe(seconds);
}

void ServerMetrics::end_to_end(double seconds) {
  std::lock_guard lock(mutex_);
  end_to_end_.observe(seconds);
}

void ServerMetrics::count_request(int status) {
  std::lock_guard lock(mutex_);
  const auto found = std::find_if(requests_by_status_.begin(), requests_by_status_.end(),
                                  [status](const auto& entry) { return entry.first == status; });
  if (found == requests_by_status_.end())
    requests_by_status_.emplace_back(status, 1);
  else
    ++found->second;
}

void ServerMetrics::count_tokens(int64_t num_prompt_tokens, int64_t num_generation_tokens) {
  std::lock_guard lock(mutex_);
  num_prompt_tokens_ += num_prompt_tokens;
  num_generation_tokens_ += num_generation_tokens;
}

std::string ServerMetrics::render(const engine::EngineCounters& engine, bool engine_alive) const {
  std::string text;
  text += metric("jambo_engine_alive", "gauge", "1 while the engine loop runs, 0 once it died", engine_alive);
  text += metric("jambo_num_requests_running", "gauge", "sequences being prefilled or decoded", engine.num_running);
  text += metric("jambo_num_requests_waiting", "gauge", "sequences waiting for admission", engine.num_waiting);
  text += metric("jambo_kv_blocks_used", "gauge", "paged KV cache blocks in use", engine.kv_blocks_used);
  text += metric("jambo_kv_blocks_total", "gauge", "paged KV cache blocks in the pool", engine.kv_blocks_total);
  text += metric("jambo_state_slots_used", "gauge", "recurrent-state slots leased", engine.slots_used);
  text += metric("jambo_state_slots_total", "gauge", "recurrent-state slots in the pool", engine.slots_total);
  text += metric("jambo_slot_reuses_total", "counter", "leases of a slot that an earlier sequence held",
                 engine.slot_reuses);
  text += metric("jambo_preemptions_total", "counter", "sequences preempted (recomputed later)", engine.preemptions);
  text += metric("jambo_prefill_tokens_total", "counter", "tokens run by prefill rows, recomputation included",
                 engine.prefill_tokens);
  text += metric("jambo_decode_tokens_total", "counter", "tokens run by decode rows", engine.decode_tokens);
  text += metric("jambo_law_violations_total", "counter", "rows refused by the checked mode (law 2)",
                 engine.law_violations);
  text += metric("jambo_engine_steps_total", "counter", "forward steps run", engine.steps);
  text += metric("jambo_nonfinite_logit_rows_total", "counter",
                 "step rows whose logits held NaN or infinity (their logprobs are NaN)", engine.nonfinite_rows);
  std::lock_guard lock(mutex_);
  text += render_prefix_cache(engine);
  text += metric("jambo_prompt_tokens_total", "counter", "prompt tokens of finished requests", num_prompt_tokens_);
  text += metric("jambo_generation_tokens_total", "counter", "tokens generated for finished requests",
                 num_generation_tokens_);
  text +=
      "# HELP jambo_http_requests_total HTTP requests answered, by status (499: the client left first)\n"
      "# TYPE jambo_http_requests_total counter\n";
  for (const auto& [status, count] : requests_by_status_)
    text += fmt::format("jambo_http_requests_total{{status=\"{}\"}} {}\n", status, count);
  text += time_to_first_token_.render("jambo_time_to_first_token_seconds", "time from arrival to the first token");
  text += inter_token_latency_.render("jambo_inter_token_latency_seconds", "time between two tokens of one choice");
  text += end_to_end_.render("jambo_e2e_request_latency_seconds", "time from arrival to the last token");
  return text;
}

ThroughputLog::ThroughputLog(const engine::EngineCounters& engine, Clock::time_point now)
    : last_(engine), last_time_(now) {}

std::optional<std::string> ThroughputLog::next(const engine::EngineCounters& engine, Clock::time_point now) {
  const engine::EngineCounters last = std::exchange(last_, engine);
  const double seconds = std::chrono::duration<double>(now - std::exchange(last_time_, now)).count();
  const bool holds_the_same = engine.num_running == last.num_running && engine.num_waiting == last.num_waiting &&
                              engine.kv_blocks_used == last.kv_blocks_used && engine.slots_used == last.slots_used;
  if (engine.steps == last.steps && holds_the_same) return std::nullopt;
  const double kv_percent = 100.0 * double(engine.kv_blocks_used) / double(engine.kv_blocks_total);
  return fmt::format(
      "prefill {:.1f} tok/s, decode {:.1f} tok/s, {} running, {} waiting, KV blocks {}/{} ({:.1f}%), "
      "state slots {}/{}",
      double(engine.prefill_tokens - last.prefill_tokens) / seconds,
      double(engine.decode_tokens - last.decode_tokens) / seconds, engine.num_running, engine.num_waiting,
      engine.kv_blocks_used, engine.kv_blocks_total, kv_percent, engine.slots_used, engine.slots_total);
}

}  // namespace jambo::server
