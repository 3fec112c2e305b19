#include "engine/engine.h"

#include "backend/nonfinite_logits.h"
#include "engine/backend_factory.h"
#include "core/error.h"
#include "engine/kv_block_manager.h"
#include "engine/memory_budget.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/trace.h"

#include <algorithm>
#include <random>
#include <unordered_map>
#include <utility>

namespace jambo::engine {

namespace {

// Every id the tokenizer produces must be a row of the model's embedding.
const tokenizer::Tokenizer* checked_tokenizer(const tokenizer::Tokenizer* tokenizer, const model::JambaConfig& config) {
  if (!tokenizer || tokenizer->vocab_size() <= config.vocab_size) return tokenizer;
  const int32_t highest = int32_t(tokenizer->vocab_size() - 1);
  fail("tokenizer.json: token '{}' has id {}, beyond the model's vocab_size {} (config.json)",
       tokenizer->id_to_token(highest).value_or(""), highest, config.vocab_size);
}

// A sequence's positions must exist in the model (config.json's max_position_embeddings).
int64_t resolve_max_model_len(std::optional<int64_t> asked, const model::JambaConfig& config) {
  const int64_t positions = config.max_position_embeddings;
  if (!asked) return std::min(kDefaultMaxModelLen, positions);
  JAMBO_REQUIRE(*asked >= 1, "max_model_len must be >= 1, got {}", *asked);
  JAMBO_REQUIRE(*asked <= positions, "max_model_len {} exceeds the model's max_position_embeddings ({})", *asked,
                positions);
  return *asked;
}

// The options checked, max_model_len resolved for this model.
EngineOptions resolve_options(EngineOptions options, const model::JambaConfig& config) {
  JAMBO_REQUIRE(options.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got {}",
                options.max_num_batched_tokens);
  JAMBO_REQUIRE(options.max_num_seqs >= 1, "max_num_seqs must be >= 1, got {}", options.max_num_seqs);
  JAMBO_REQUIRE(options.kv_block_size >= 1, "kv_block_size must be >= 1, got {}", options.kv_block_size);
  options.max_model_len = resolve_max_model_len(options.max_model_len, config);
  JAMBO_REQUIRE(!options.max_num_checkpoints || *options.max_num_checkpoints >= 0,
                "max_num_checkpoints must be >= 0, got {}", options.max_num_checkpoints.value_or(0));
  return options;
}

CachePlan plan_engine_cache(const model::Model& model, const EngineOptions& options) {
  const BackendChoice& backend = options.backend;
  CheckpointWish checkpoints;
  if (options.enable_prefix_caching)
    checkpoints = options.max_num_checkpoints ? CheckpointWish{*options.max_num_checkpoints, true}
                                              : CheckpointWish{2 * options.max_num_seqs, false};
  const MemoryShare share = memory_share(backend, model);
  return plan_cache(share.config, share.weight_bytes, options.memory_budget.resolve(backend.kind),
                    options.max_num_seqs, options.kv_block_size, *options.max_model_len, backend.state_dtype,
                    checkpoints);
}

}  // namespace

struct Engine::Impl {
  Impl(const model::Model& model, const tokenizer::Tokenizer* tokenizer, const EngineOptions& options);

  void inject_faults(const EngineFaults& faults);
  void validate(const RequestSpec& spec) const;
  void add_request(const RequestSpec& spec);
  void abort_request(const std::string& id);
  void end_request(Request& request, const std::string& error);
  std::vector<std::string> fail_nonfinite_rows(const std::vector<ScheduledRow>& rows, const backend::StepOutput& output);
  std::vector<SampleOutput> step();
  void update_counters();
  Request* find(const std::string& id);
  void forget_finished(const std::vector<ScheduledRow>& rows);

  // After a row ran: its prompt logprobs, and a new token once all its tokens are in its state.
  void advance(const ScheduledRow& row, size_t row_index, const backend::RowOutput& output);
  void record_prompt_logprobs(const ScheduledRow& row, const backend::RowOutput& output);
  void record_routing(const ScheduledRow& row, const backend::RowOutput& output);
  void fork(Sequence& leader);
  // The prefix cache's part of a step: checkpoint slots for the rows that pass a boundary to save, and after the run,
  // the prompts' full blocks and the saved checkpoints into the cache.
  void reserve_checkpoints(std::vector<ScheduledRow>& rows);
  void cache_prefixes(const std::vector<ScheduledRow>& rows, const backend::StepOutput& output);
  void resume_from_prefix(Sequence& sequence, const PrefixMatch& match);
  std::unique_ptr<PrefixCache> make_prefix_cache(const model::JambaConfig& config);
  void take_token(Sequence& sequence, backend::ChosenToken chosen);
  void finish(Sequence& sequence, const std::string& reason);
  void report(const Sequence& sequence) const;

  const tokenizer::Tokenizer* tokenizer;
  EngineOptions options;  // max_model_len resolved
  CachePlan cache_plan;
  std::unique_ptr<backend::Backend> backend;
  SlotPool slots;
  KvBlockManager kv_blocks;
  std::string prefix_caching_status;
  std::unique_ptr<PrefixCache> prefix_cache;  // none where prefix caching is off
  ModelRunner runner;
  Scheduler scheduler;
  Trace trace;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests;  // unfinished, by id
  std::vector<SampleOutput> finished;  // samples finished (or aborted) since the last step returned
  int64_t num_arrivals = 0;
  int64_t num_sequences = 0;
  EngineCounters counters;
  ProgressListener listener;
  Engine::Sleep asleep;
  bool weights_dropped = false;                  // by a sleep at level 2: the wake reads the checkpoint again
  const std::string checkpoint_weight_version;  // options.weight_version as the engine was made
  const model::Model model;                     // the weights' names and shapes, for updates
};

Engine::Impl::Impl(const model::Model& model, const tokenizer::Tokenizer* tokenizer, const EngineOptions& options)
    : tokenizer(checked_tokenizer(tokenizer, model.config)),
      options(resolve_options(options, model.config)),
      cache_plan(plan_engine_cache(model, this->options)),
      backend(make_backend(options.backend, model, cache_plan.cache)),
      slots(cache_plan.cache.num_state_slots, options.slot_policy, options.slot_seed),
      kv_blocks(cache_plan.cache.num_kv_blocks, options.kv_block_size, model.config.num_attention_layers() > 0),
      prefix_caching_status(this->options.enable_prefix_caching ? "" : "off (--no-enable-prefix-caching)"),
      prefix_cache(make_prefix_cache(model.config)),
      runner(*backend, slots, options.kv_block_size, options.checked),
      scheduler(
          options.max_num_batched_tokens, slots, kv_blocks, [this](int64_t slot) { runner.on_slot_freed(slot); },
          prefix_cache.get(), [this](Sequence& sequence, const PrefixMatch& match) { resume_from_prefix(sequence, match); }),
      trace(options.trace_path),
      checkpoint_weight_version(options.weight_version),
      model(model) {
  inject_faults(options.faults);
}

std::unique_ptr<PrefixCache> Engine::Impl::make_prefix_cache(const model::JambaConfig& config) {
  if (!prefix_caching_status.empty()) return nullptr;
  const int64_t num_checkpoints = cache_plan.cache.num_checkpoints;
  const bool has_mamba = config.num_mamba_layers() > 0;
  const std::string checkpoint_size = cache_plan.bytes_per_slot < (1 << 20)
                                          ? fmt::format("{:.1f} KiB", cache_plan.bytes_per_slot / 1024.0)
                                          : fmt::format("{:.1f} MiB", cache_plan.bytes_per_slot / 1048576.0);
  if (has_mamba && num_checkpoints == 0) {
    prefix_caching_status = fmt::format(
        "off: no recurrent-state checkpoint ({} each) fits the memory budget beside the slots and KV blocks",
        checkpoint_size);
    return nullptr;
  }
  prefix_caching_status = fmt::format("on ({} checkpoints of {}, {}-token blocks)", num_checkpoints, checkpoint_size,
                                      options.kv_block_size);
  // Checkpoint c is the backend's slot num_state_slots + c (CacheConfig); an evicted one is poisoned in checked mode.
  return std::make_unique<PrefixCache>(options.kv_block_size, config.num_attention_layers() > 0, has_mamba, kv_blocks,
                                       num_checkpoints, cache_plan.cache.num_state_slots,
                                       [this](int64_t slot) { runner.on_slot_freed(slot); });
}

// The backend reproduces the state-cache faults (a stale checkpoint is the engine's: resume_from_prefix); the offset
// wrap aliases the upper half of the slots onto the lower.
void Engine::Impl::inject_faults(const EngineFaults& faults) {
  backend::FaultInjection injection;
  injection.decode_before_prefill = faults.decode_before_prefill;
  if (faults.wrap_state_offsets)
    injection.state_offset_modulus =
        backend->state_elements_per_slot() * std::max<int64_t>(1, cache_plan.cache.num_state_slots / 2);
  backend->inject_faults(injection);
}

void Engine::Impl::validate(const RequestSpec& spec) const {
  RequestLimits limits;
  limits.vocab_size = backend->config().vocab_size;
  limits.max_model_len = *options.max_model_len;
  limits.max_n = slots.num_slots();
  limits.has_tokenizer = tokenizer != nullptr;
  if (const std::optional<FieldError> error = engine::validate(spec, limits))
    fail("request '{}': field '{}' {}", spec.id, error->field, error->message);
  const int64_t num_tokens = int64_t(spec.prompt_ids.size()) + spec.stop.max_tokens;
  JAMBO_REQUIRE(spec.n * kv_blocks.blocks_for(num_tokens) <= kv_blocks.num_blocks(),
                "request '{}': n = {} samples of {} tokens need {} KV blocks; the memory budget holds {}", spec.id,
                spec.n, num_tokens, spec.n * kv_blocks.blocks_for(num_tokens), kv_blocks.num_blocks());
}

Request* Engine::Impl::find(const std::string& id) {
  const auto found = requests.find(id);
  return found == requests.end() ? nullptr : found->second.get();
}

void Engine::Impl::add_request(const RequestSpec& spec) {
  validate(spec);
  JAMBO_REQUIRE(!find(spec.id), "request '{}': a request with this id is already running", spec.id);
  auto request = std::make_unique<Request>();
  request->spec = spec;
  request->arrival = num_arrivals++;
  request->seed = spec.sampling.seed ? *spec.sampling.seed : std::random_device{}();
  if (request->wants_prompt_logprobs()) {
    request->prompt_logprobs.assign(spec.prompt_ids.size(), std::nullopt);
    request->prompt_top_logprobs.resize(spec.prompt_ids.size());
  }
  if (spec.return_routed_experts) request->prompt_routed_experts.resize(spec.prompt_ids.size());
  for (int64_t s = 0; s < spec.n; ++s)
    request->samples.push_back(std::make_unique<Sequence>(
        *request, num_sequences++, s, SequenceSampler(request->spec, request->seed, s, backend->config(), tokenizer)));
  Sequence& leader = *request->samples[0];
  scheduler.add(leader);
  trace.event(counters.steps, leader, "queued",
              {{"num_prompt_tokens", spec.prompt_ids.size()}, {"n", spec.n}, {"max_tokens", spec.stop.max_tokens}});
  requests.emplace(spec.id, std::move(request));
}

void Engine::Impl::abort_request(const std::string& id) {
  Request* request = find(id);
  JAMBO_REQUIRE(request, "cannot abort request '{}': no unfinished request has this id", id);
  end_request(*request, "");
  requests.erase(id);
}

// Ends every unfinished sample of the request and frees its memory: aborted, or failed with the error.
void Engine::Impl::end_request(Request& request, const std::string& error) {
  for (const auto& sample : request.samples) {
    if (sample->is_done()) continue;
    scheduler.remove(*sample);
    sample->abort(error);
    if (error.empty())
      trace.event(counters.steps, *sample, "aborted");
    else
      trace.event(counters.steps, *sample, "failed", {{"error", error}});
    report(*sample);
    finished.push_back(sample->output);
  }
}

// A row whose logits are not finite fails its request (backend/nonfinite_logits.h); returns the errors, one per
// failed request.
std::vector<std::string> Engine::Impl::fail_nonfinite_rows(const std::vector<ScheduledRow>& rows,
                                                           const backend::StepOutput& output) {
  std::vector<std::string> errors;
  for (size_t r = 0; r < rows.size(); ++r) {
    Sequence& sequence = *rows[r].sequence;
    if (output.rows[r].finite || sequence.is_done()) continue;  // done: an earlier row failed its request
    errors.push_back(backend::nonfinite_logits_message(fmt::format(
        "request '{}' sample {} (sequence {}), step {}", sequence.request.spec.id, sequence.sample, sequence.id,
        counters.steps)));
    end_request(sequence.request, errors.back());
  }
  return errors;
}

std::vector<SampleOutput> Engine::Impl::step() {
  JAMBO_REQUIRE(requests.empty() || !(asleep.weights || asleep.caches),
                "the engine sleeps ({} asleep) with {} requests to run: wake it first",
                asleep.weights ? "weights" : "caches", requests.size());
  StepPlan plan = scheduler.schedule();
  for (Sequence* sequence : plan.preempted)
    trace.event(counters.steps, *sequence, "preempted", {{"num_generated", sequence->num_generated()}});
  for (Sequence* sequence : plan.admitted) {
    nlohmann::json admitted = {{"slot", sequence->lease->slot}, {"recompute", sequence->num_uncomputed()}};
    if (sequence->resumed_from) {
      admitted["cached_tokens"] = sequence->num_cached_tokens;
      admitted["checkpoint_slot"] = sequence->resumed_from->backend_slot;
      admitted["checkpoint_owner"] = sequence->resumed_from->owner;
      admitted["checkpoint_generation"] = sequence->resumed_from->lease.generation;
    }
    trace.event(counters.steps, *sequence, "admitted", std::move(admitted));
  }
  JAMBO_ASSERT(!plan.rows.empty() || requests.empty());
  if (!plan.rows.empty()) {
    reserve_checkpoints(plan.rows);
    trace.step(counters.steps, plan.rows);
    const backend::StepOutput& output = runner.run(plan.rows);
    cache_prefixes(plan.rows, output);
    const std::vector<std::string> errors = fail_nonfinite_rows(plan.rows, output);
    for (size_t r = 0; r < plan.rows.size(); ++r)
      if (!plan.rows[r].sequence->is_done()) advance(plan.rows[r], r, output.rows[r]);
    forget_finished(plan.rows);
    ++counters.steps;
    if (!errors.empty())
      throw backend::NonFiniteLogits(errors.size() == 1 ? errors[0]
                                                        : fmt::format("{} (and {} more requests failed in this step)",
                                                                      errors[0], errors.size() - 1));
  }
  return std::exchange(finished, {});
}

// Only requests with a row in this step can have finished in it; ids first, since a request owns its rows'
// sequences.
void Engine::Impl::forget_finished(const std::vector<ScheduledRow>& rows) {
  std::vector<std::string> done_ids;
  for (const ScheduledRow& row : rows)
    if (row.sequence->request.is_done()) done_ids.push_back(row.sequence->request.spec.id);
  for (const std::string& id : done_ids) requests.erase(id);
}

void Engine::Impl::advance(const ScheduledRow& row, size_t row_index, const backend::RowOutput& output) {
  Sequence& sequence = *row.sequence;
  (sequence.state() == SequenceState::Decoding ? counters.decode_tokens : counters.prefill_tokens) += row.num_tokens;
  record_prompt_logprobs(row, output);
  record_routing(row, output);
  sequence.computed(row.num_tokens);
  if (sequence.num_uncomputed() > 0) return;  // more prefill chunks to come

  if (sequence.state() == SequenceState::Prefilling)
    trace.event(counters.steps, sequence, "prefill_done", {{"num_tokens", sequence.num_computed()}});
  const bool forking = sequence.leads_fork();
  sequence.request.prompt_computed = true;
  if (forking) fork(sequence);
  const std::vector<Sequence*>& choosers = runner.choosers(row_index);
  JAMBO_ASSERT(choosers.size() == output.chosen.size());
  for (size_t i = 0; i < choosers.size(); ++i) take_token(*choosers[i], output.chosen[i]);
}

// Target i of the row is the prompt token at start + i + 1 (ModelRunner asked for them).
void Engine::Impl::record_prompt_logprobs(const ScheduledRow& row, const backend::RowOutput& output) {
  Request& request = row.sequence->request;
  const int64_t start = row.sequence->num_computed();
  for (size_t i = 0; i < output.target_logprobs.size(); ++i) {
    request.prompt_logprobs[start + i + 1] = output.target_logprobs[i];
    if (!output.target_top_logprobs.empty()) request.prompt_top_logprobs[start + i + 1] = output.target_top_logprobs[i];
  }
}

// The routing of the row's tokens: a prompt token's into the request (the samples share it), a generated one's into
// the sample's output. A token run again after a preemption gets the same routing again (invariance).
void Engine::Impl::record_routing(const ScheduledRow& row, const backend::RowOutput& output) {
  Sequence& sequence = *row.sequence;
  Request& request = sequence.request;
  if (!request.spec.return_routed_experts) return;
  const model::JambaConfig& config = backend->config();
  const int64_t num_layers = config.num_moe_layers(), k = config.num_experts_per_tok;
  JAMBO_ASSERT(int64_t(output.routed_experts.size()) == row.num_tokens * num_layers * k);
  auto next = output.routed_experts.begin();
  for (int64_t position = sequence.num_computed(); position < sequence.num_computed() + row.num_tokens; ++position) {
    TokenRouting routing(static_cast<size_t>(num_layers));
    for (std::vector<int32_t>& experts : routing) {
      experts.assign(next, next + k);
      next += k;
    }
    const int64_t generated = position - request.num_prompt_tokens();
    if (generated < 0) {
      request.prompt_routed_experts[position] = std::move(routing);
    } else {
      std::vector<TokenRouting>& routed = sequence.output.routed_experts;
      if (int64_t(routed.size()) <= generated) routed.resize(size_t(generated) + 1);
      routed[generated] = std::move(routing);
    }
  }
}

// Law 2 for checkpoints: the checkpoint must still be the cache's, at the generation the match saw.
void Engine::Impl::resume_from_prefix(Sequence& sequence, const PrefixMatch& match) {
  if (!match.checkpoint) return;  // a model without Mamba layers: the KV blocks are the whole state
  const CheckpointLease checkpoint =
      options.faults.serve_stale_checkpoint ? prefix_cache->stale_checkpoint(match) : *match.checkpoint;
  if (options.checked && !prefix_cache->holds(checkpoint))
    fail("law 2 violation: request '{}' sample {} (sequence {}): checkpoint slot {} generation {} is not held by its "
         "cache entry",
         sequence.request.spec.id, sequence.sample, sequence.id, checkpoint.backend_slot, checkpoint.lease.generation);
  backend->copy_state(checkpoint.backend_slot, sequence.lease->slot);
  sequence.resumed_from = checkpoint;
}

// The boundaries a row passes where its sequence saves a checkpoint: those of its prompt chosen at admission, and
// past the prompt, the last block boundary the row reaches (a rolling checkpoint of the generated tokens, so that a
// next chat turn that sends this output back resumes after it).
std::vector<int64_t> checkpoints_in_row(const ScheduledRow& row, int64_t block_size) {
  const Sequence& sequence = *row.sequence;
  const int64_t start = sequence.num_computed(), end = start + row.num_tokens;
  std::vector<int64_t> boundaries;
  for (int64_t boundary : sequence.checkpoint_boundaries)
    if (boundary > start && boundary <= end) boundaries.push_back(boundary);
  const int64_t last = end - end % block_size;
  if (last > start && last > sequence.request.num_prompt_tokens() && (boundaries.empty() || boundaries.back() < last))
    boundaries.push_back(last);
  return boundaries;
}

void Engine::Impl::reserve_checkpoints(std::vector<ScheduledRow>& rows) {
  if (!prefix_cache) return;
  for (ScheduledRow& row : rows) {
    if (row.sequence->request.wants_prompt_logprobs()) continue;
    const int64_t start = row.sequence->num_computed();
    for (int64_t boundary : checkpoints_in_row(row, options.kv_block_size)) {
      const std::optional<CheckpointLease> checkpoint = prefix_cache->reserve_checkpoint();
      if (!checkpoint) break;  // every checkpoint is being written this step
      row.checkpoints.push_back({boundary - start, checkpoint->backend_slot});
      row.checkpoint_leases.push_back(*checkpoint);
    }
  }
}

// A row whose logits are not finite caches nothing, and its checkpoints go back. The others' full blocks enter the
// cache as they fill, with their checkpoints; a sequence keeps one checkpoint past its prompt, the latest.
void Engine::Impl::cache_prefixes(const std::vector<ScheduledRow>& rows, const backend::StepOutput& output) {
  if (!prefix_cache) return;
  const int64_t block_size = options.kv_block_size;
  for (size_t r = 0; r < rows.size(); ++r) {
    const ScheduledRow& row = rows[r];
    Sequence& sequence = *row.sequence;
    if (!output.rows[r].finite) {
      for (const CheckpointLease& checkpoint : row.checkpoint_leases) prefix_cache->release_checkpoint(checkpoint);
      continue;
    }
    if (sequence.request.wants_prompt_logprobs()) continue;
    const int64_t start = sequence.num_computed(), end = start + row.num_tokens;
    for (size_t c = 0; c < row.checkpoints.size(); ++c) {
      const int64_t boundary = start + row.checkpoints[c].num_tokens;
      prefix_cache->insert(sequence.tokens(), boundary, sequence.block_table, row.checkpoint_leases[c]);
      if (boundary <= sequence.request.num_prompt_tokens()) continue;
      if (sequence.generated_checkpoint)
        prefix_cache->drop_checkpoint(sequence.tokens(), sequence.generated_checkpoint->first,
                                      sequence.generated_checkpoint->second);
      sequence.generated_checkpoint = {boundary, row.checkpoint_leases[c]};
    }
    if (end / block_size > start / block_size)  // a block filled
      prefix_cache->insert(sequence.tokens(), end - end % block_size, sequence.block_table, std::nullopt);
  }
}

// The other samples got a slot and the prompt's KV blocks (its full blocks shared, a partial last one their own)
// when the last prompt chunk was scheduled; now that it ran, they get its state and the partial block's keys.
void Engine::Impl::fork(Sequence& leader) {
  for (size_t s = 1; s < leader.request.samples.size(); ++s) {
    Sequence& sample = *leader.request.samples[s];
    backend->copy_state(leader.lease->slot, sample.lease->slot);
    for (size_t b = 0; b < sample.block_table.size(); ++b)
      if (sample.block_table[b] != leader.block_table[b])  // the partial last block; the full ones are shared
        backend->copy_kv_block(leader.block_table[b], sample.block_table[b]);
    scheduler.start_forked(sample);
    trace.event(counters.steps, sample, "admitted", {{"slot", sample.lease->slot}, {"forked_from", 0}});
  }
}

void Engine::Impl::take_token(Sequence& sequence, backend::ChosenToken chosen) {
  if (sequence.num_generated() == 0) {  // the prompt has run: its logprobs are complete
    sequence.output.prompt_logprobs = sequence.request.prompt_logprobs;
    sequence.output.prompt_top_logprobs = sequence.request.prompt_top_logprobs;
    sequence.output.prompt_routed_experts = sequence.request.prompt_routed_experts;
  }
  if (sequence.request.spec.stop.max_tokens == 0) return finish(sequence, "length");
  const int32_t token = chosen.token;
  sequence.append(token, chosen.logprob, std::move(chosen.top_logprobs), options.weight_version);
  if (const auto reason = sequence.sampler.accept(token, sequence.num_generated())) return finish(sequence, *reason);
  report(sequence);
}

void Engine::Impl::finish(Sequence& sequence, const std::string& reason) {
  scheduler.remove(sequence);
  sequence.finish(reason);
  trace.event(counters.steps, sequence, "finished",
              {{"finish_reason", reason}, {"num_generated", sequence.num_generated()}});
  report(sequence);
  finished.push_back(sequence.output);
}

void Engine::Impl::report(const Sequence& sequence) const {
  if (listener) listener({sequence.output, sequence.sampler.text(), sequence.is_done()});
}

void Engine::Impl::update_counters() {
  counters.num_running = scheduler.num_running();
  counters.num_waiting = scheduler.num_waiting();
  counters.kv_blocks_used = kv_blocks.num_used();
  counters.kv_blocks_total = kv_blocks.num_blocks();
  counters.slots_used = slots.num_used();
  counters.slots_total = slots.num_slots();
  counters.slot_reuses = slots.num_reuses();
  counters.highest_slot_used = slots.highest_used();
  counters.preemptions = scheduler.num_preemptions();
  counters.law_violations = runner.num_law_violations();
  counters.forward_seconds = runner.forward_seconds();
  counters.nonfinite_rows = runner.num_nonfinite_rows();
  counters.prefix_caching = prefix_cache != nullptr;
  if (prefix_cache) {
    counters.prefix_cache = prefix_cache->counters();
    counters.kv_blocks_used -= counters.prefix_cache.kv_blocks_only_cached;  // free to take, as free blocks are
  }
}

Engine::Engine(const model::Model& model, const tokenizer::Tokenizer* tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, options)) {}

Engine::~Engine() = default;

void Engine::add_request(const RequestSpec& spec) { impl_->add_request(spec); }

void Engine::abort_request(const std::string& id) { impl_->abort_request(id); }

bool Engine::has_unfinished() const { return !impl_->requests.empty() || !impl_->finished.empty(); }

std::vector<SampleOutput> Engine::step() { return impl_->step(); }

void Engine::set_progress_listener(ProgressListener listener) { impl_->listener = std::move(listener); }

int64_t Engine::max_model_len() const { return *impl_->options.max_model_len; }

const EngineCounters& Engine::counters() const {
  impl_->update_counters();
  return impl_->counters;
}

const std::string& Engine::weight_version() const { return impl_->options.weight_version; }

// Cached prefixes are the old weights' states: a new name empties the cache, as does any update.
void Engine::set_weight_version(std::string version) {
  if (impl_->prefix_cache && version != impl_->options.weight_version)
    impl_->prefix_cache->clear(PrefixMiss::WeightVersion);
  impl_->options.weight_version = std::move(version);
}

void Engine::update_weights(const model::WeightUpdate& update, std::string version) {
  JAMBO_REQUIRE(!impl_->asleep.weights, "the weights sleep: wake them (wake_up with the weights) before an update");
  impl_->backend->update_weights(update);
  if (impl_->prefix_cache) impl_->prefix_cache->clear(PrefixMiss::WeightVersion);
  set_weight_version(std::move(version));
}

const std::string& Engine::prefix_caching_status() const { return impl_->prefix_caching_status; }

void Engine::reset_prefix_cache() {
  if (impl_->prefix_cache) impl_->prefix_cache->clear();
}

void Engine::update_weights_from_ipc(std::span<const backend::IpcTensor> tensors, std::string version) {
  JAMBO_REQUIRE(!impl_->asleep.weights, "the weights sleep: wake them (wake_up with the weights) before an update");
  const model::Checkpoint shared = impl_->backend->open_ipc_tensors(tensors);
  update_weights(model::match_weight_update(shared, impl_->model), std::move(version));
}

void Engine::sleep(backend::SleepLevel level) {
  JAMBO_REQUIRE(impl_->requests.empty(),
                "cannot sleep with {} requests unfinished (their state would be lost): pause in abort or wait mode "
                "first",
                impl_->requests.size());
  if (impl_->prefix_cache) impl_->prefix_cache->clear(PrefixMiss::Evicted);  // before the memory goes
  impl_->backend->sleep(level);
  impl_->asleep = {.weights = true, .caches = true};
  impl_->weights_dropped = impl_->weights_dropped || level == backend::SleepLevel::DropWeights;
}

void Engine::wake_up(const backend::WakeTags& tags) {
  impl_->backend->wake_up(tags);
  if (tags.weights && impl_->asleep.weights) {
    impl_->asleep.weights = false;
    if (std::exchange(impl_->weights_dropped, false)) set_weight_version(impl_->checkpoint_weight_version);
  }
  if (tags.caches) impl_->asleep.caches = false;
}

Engine::Sleep Engine::sleeping() const { return impl_->asleep; }

void Engine::corrupt_lease_for_testing(const std::string& id) {
  Request* request = impl_->find(id);
  JAMBO_REQUIRE(request, "corrupt_lease_for_testing: no unfinished request '{}'", id);
  for (const auto& sample : request->samples) {
    if (!sample->lease || !sample->is_running()) continue;
    ++sample->lease->generation;  // as if it kept the lease of an earlier owner of its slot
    return;
  }
  fail("corrupt_lease_for_testing: request '{}' holds no slot", id);
}

}  // namespace jambo::engine
