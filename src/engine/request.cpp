#include "engine/request.h"

#include "core/error.h"

namespace jambo::engine {

const char* state_name(SequenceState state) {
  switch (state) {
    case SequenceState::Waiting:
      return "waiting";
    case SequenceState::Prefilling:
      return "prefilling";
    case SequenceState::Decoding:
      return "decoding";
    case SequenceState::Finished:
      return "finished";
    case SequenceState::Aborted:
      return "aborted";
  }
  return "unknown";
}

Sequence::Sequence(Request& request, int64_t id, int64_t sample, SequenceSampler sampler)
    : request(request), id(id), sample(sample), sampler(std::move(sampler)), tokens_(request.spec.prompt_ids) {
  output.id = request.spec.id;
  output.sample = sample;
  output.prompt_ids = request.spec.prompt_ids;
}

bool Sequence::leads_fork() const { return sample == 0 && request.spec.n > 1 && !request.prompt_computed; }

void Sequence::require_state(bool allowed, const char* transition) const {
  if (!allowed)
    fail_internal("internal error: request '{}' sample {} cannot {} while {} (please report this)", request.spec.id,
                  sample, transition, state_name(state_));
}

void Sequence::admit(SlotLease new_lease, int64_t num_cached, std::vector<int64_t> boundaries) {
  require_state(state_ == SequenceState::Waiting && num_cached >= 0 && num_cached < int64_t(tokens_.size()),
                "be admitted");
  lease = new_lease;
  num_computed_ = num_cached;
  num_cached_tokens = num_cached;
  resumed_from.reset();
  checkpoint_boundaries = std::move(boundaries);
  state_ = SequenceState::Prefilling;
}

void Sequence::computed(int64_t num_tokens) {
  require_state(is_running() && num_tokens <= num_uncomputed(), "compute tokens");
  num_computed_ += num_tokens;
}

void Sequence::start_from_fork(SlotLease new_lease, int64_t num_prompt_tokens) {
  require_state(state_ == SequenceState::Waiting && sample > 0 && num_computed_ == 0, "fork");
  lease = new_lease;
  num_computed_ = num_prompt_tokens;
  state_ = SequenceState::Prefilling;
}

void Sequence::append(int32_t token, double logprob, std::vector<backend::TokenLogprob> top,
                      const std::string& weight_version) {
  require_state(is_running() && num_uncomputed() == 0, "take a new token");
  tokens_.push_back(token);
  const int64_t index = int64_t(output.ids.size());
  if (output.weight_versions.empty() || output.weight_versions.back().version != weight_version)
    output.weight_versions.push_back({weight_version, index, index});
  output.weight_versions.back().end = index + 1;
  output.ids.push_back(token);
  output.logprobs.push_back(logprob);
  output.top_logprobs.push_back(std::move(top));
  state_ = SequenceState::Decoding;
}

void Sequence::preempt() {
  require_state(is_running(), "be preempted");
  lease.reset();
  num_computed_ = 0;
  state_ = SequenceState::Waiting;
}

void Sequence::finish(const std::string& reason) {
  require_state(is_running(), "finish");
  sampler.finish_text();
  output.text = sampler.text();
  output.finish_reason = reason;
  state_ = SequenceState::Finished;
}

void Sequence::abort(const std::string& error) {
  require_state(!is_done(), "be aborted");
  output.text = sampler.text();
  output.finish_reason = error.empty() ? "abort" : "error";
  output.error = error;
  state_ = SequenceState::Aborted;
}

bool Request::is_done() const {
  for (const auto& sample : samples)
    if (!sample->is_done()) return false;
  return true;
}

}  // namespace jambo::engine
