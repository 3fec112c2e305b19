// The per-sample side of sampling: a seeded Sampler (its seed derived from the request's seed and the
// sample index only, so scheduling never changes a sample) and the stop rules
// (EOS, stop token ids, stop strings, max tokens) with the sample's text decoded incrementally.
#pragma once

#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

#include <optional>
#include <string>

namespace jambo::engine {

// The seed of sample `sample` of a request seeded with `seed`; sample 0 keeps the request's seed, so
// n = 1 samples exactly like `jambo generate --seed`.
uint64_t sample_seed(uint64_t seed, int64_t sample);

// The length of the prefix of a sample's text that no stop string can cut any more: all of it once the sample
// finished, else all but the last max_stop_length - 1 bytes (a stop string may still begin there), never ending
// inside a UTF-8 character. What streams to a client or a terminal.
size_t stable_text_length(const std::string& text, bool finished, size_t max_stop_length);

class SequenceSampler {
 public:
  // tokenizer may be null when the request has no stop strings.
  SequenceSampler(const RequestSpec& spec, uint64_t request_seed, int64_t sample, const model::JambaConfig& config,
                  const tokenizer::Tokenizer* tokenizer);

  // How the next token is chosen (takes a draw of the sample's generator when sampling).
  backend::TokenChoice next_choice() { return sampler_.next_choice(); }
  // Takes the sample's num_generated-th token (already picked); returns "stop" or "length" when it ends
  // the sample, nothing otherwise.
  std::optional<std::string> accept(int32_t token, int64_t num_generated);
  // The text so far (cut before a stop string; the decoder's tail included once the sample finished).
  const std::string& text() const { return text_; }
  void finish_text();

 private:
  bool is_stop_token(int32_t token) const;
  bool found_stop_string(int64_t searched_from);

  const RequestSpec& spec_;
  const model::JambaConfig& config_;
  Sampler sampler_;
  std::optional<tokenizer::IncrementalDecoder> decoder_;  // only when a tokenizer is given
  std::string text_;
  bool text_finished_ = false;
};

}  // namespace jambo::engine
