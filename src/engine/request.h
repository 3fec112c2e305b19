// A request's lifecycle as an explicit state machine. One Request per caller request; one Sequence
// per sample. Before its prompt is computed a request runs as its sample 0 alone; when the prompt's
// last chunk has run, its state and KV blocks are copied into the other n - 1 samples (the fork),
// and from then on every sample is scheduled, preempted and finished on its own.
//
//   waiting --admit--> prefilling --prompt and recomputed tokens done--> decoding --stop--> finished
//      ^                   |                                                |
//      +----preempt--------+------------------------------------------------+     (any) --abort--> aborted
//
// An aborted sample with an error failed: its logits were not finite.
#pragma once

#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "engine/sequence_sampler.h"
#include "engine/slot_pool.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace jambo::engine {

enum class SequenceState { Waiting, Prefilling, Decoding, Finished, Aborted };

struct Request;

class Sequence {
 public:
  Sequence(Request& request, int64_t id, int64_t sample, SequenceSampler sampler);

  Request& request;
  const int64_t id;      // unique in the engine: the slot owner and each batch row's request_id
  const int64_t sample;  // 0 .. n-1

  SequenceState state() const { return state_; }
  bool is_running() const { return state_ == SequenceState::Prefilling || state_ == SequenceState::Decoding; }
  bool is_done() const { return state_ == SequenceState::Finished || state_ == SequenceState::Aborted; }
  // Law 1: a state exists only once some of this sequence's tokens ran in an earlier step.
  bool has_state() const { return num_computed_ > 0; }
  // The sample 0 of a request whose prompt still has to be copied into its other samples.
  bool leads_fork() const;

  const std::vector<int32_t>& tokens() const { return tokens_; }  // [prompt + generated]
  int64_t num_computed() const { return num_computed_; }          // tokens folded into state and KV
  int64_t num_uncomputed() const { return int64_t(tokens_.size()) - num_computed_; }
  int64_t num_generated() const { return int64_t(output.ids.size()); }

  // Transitions; each checks that it starts from a state that allows it.
  // waiting -> prefilling, the first num_cached_tokens tokens in state and KV from a cached prefix (the slot gets
  // the checkpoint's state before the sequence runs); the prefill saves checkpoints at checkpoint_boundaries.
  void admit(SlotLease lease, int64_t num_cached_tokens = 0, std::vector<int64_t> checkpoint_boundaries = {});
  void computed(int64_t num_tokens);                                 // the step ran num_tokens more of this sequence
  void start_from_fork(SlotLease lease, int64_t num_prompt_tokens);  // waiting -> prefilling, prompt in state
  // -> decoding; the token counted in output.weight_versions under weight_version.
  void append(int32_t token, double logprob, std::vector<backend::TokenLogprob> top, const std::string& weight_version);
  void preempt();                          // prefilling/decoding -> waiting, state dropped
  void finish(const std::string& reason);  // -> finished
  void abort(const std::string& error = "");  // -> aborted; with an error, failed (finish_reason "error")

  std::optional<SlotLease> lease;    // held while running
  std::vector<int32_t> block_table;  // [blocks] physical KV block of each logical block
  int64_t num_cached_tokens = 0;     // resumed past from a cached prefix, at the last admission
  std::optional<CheckpointLease> resumed_from;  // the checkpoint whose state its slot got then
  // The checkpoint it saved last past its prompt, and where: the next one replaces it in the prefix cache.
  std::optional<std::pair<int64_t, CheckpointLease>> generated_checkpoint;
  std::vector<int64_t> checkpoint_boundaries;  // positions whose state the prefill saves for the prefix cache
  SequenceSampler sampler;
  SampleOutput output;  // ids, logprobs, text and finish reason so far

 private:
  void require_state(bool allowed, const char* transition) const;

  SequenceState state_ = SequenceState::Waiting;
  std::vector<int32_t> tokens_;
  int64_t num_computed_ = 0;
};

struct Request {
  RequestSpec spec;
  int64_t arrival = 0;                                 // order of add_request: first come, first served
  uint64_t seed = 0;                                   // the spec's seed, or one drawn at add_request
  bool prompt_computed = false;                        // the prompt ran once (prompt logprobs taken, samples forked)
  std::vector<std::unique_ptr<Sequence>> samples;      // [n]
  std::vector<std::optional<double>> prompt_logprobs;  // [prompt] when asked
  std::vector<std::vector<backend::TokenLogprob>> prompt_top_logprobs;  // [prompt] when asked
  std::vector<TokenRouting> prompt_routed_experts;                      // [prompt] when asked

  int64_t num_prompt_tokens() const { return int64_t(spec.prompt_ids.size()); }
  bool wants_prompt_logprobs() const { return spec.num_prompt_logprobs.has_value(); }
  bool is_done() const;
};

const char* state_name(SequenceState state);

}  // namespace jambo::engine
