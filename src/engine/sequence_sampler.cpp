#include "engine/sequence_sampler.h"

#include <algorithm>

namespace jambo::engine {

uint64_t sample_seed(uint64_t seed, int64_t sample) {
  if (sample == 0) return seed;
  // splitmix64 of (seed, sample): well-spread, distinct seeds for the other samples.
  uint64_t z = seed + uint64_t(sample) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

size_t stable_text_length(const std::string& text, bool finished, size_t max_stop_length) {
  if (finished || max_stop_length <= 1) return text.size();
  size_t length = text.size() > max_stop_length - 1 ? text.size() - (max_stop_length - 1) : 0;
  const auto is_utf8_continuation = [](char byte) { return (static_cast<unsigned char>(byte) & 0xC0) == 0x80; };
  while (length > 0 && length < text.size() && is_utf8_continuation(text[length])) --length;
  return length;
}

namespace {

SamplingParams seeded(SamplingParams params, uint64_t seed) {
  params.seed = seed;
  return params;
}

}  // namespace

SequenceSampler::SequenceSampler(const RequestSpec& spec, uint64_t request_seed, int64_t sample,
                                 const model::JambaConfig& config, const tokenizer::Tokenizer* tokenizer)
    : spec_(spec),
      config_(config),
      sampler_(seeded(spec.sampling, sample_seed(request_seed, sample)), spec.num_top_logprobs) {
  if (tokenizer) decoder_.emplace(*tokenizer, /*skip_special_tokens=*/true);
}

bool SequenceSampler::is_stop_token(int32_t token) const {
  if (!spec_.stop.ignore_eos && config_.is_eos(token)) return true;
  const std::vector<int32_t>& ids = spec_.stop.token_ids;
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

// Cuts the text before the earliest stop string that ends after searched_from.
bool SequenceSampler::found_stop_string(int64_t searched_from) {
  size_t cut = std::string::npos;
  for (const std::string& stop : spec_.stop.strings) {
    const size_t from = size_t(std::max<int64_t>(0, searched_from - int64_t(stop.size()) + 1));
    cut = std::min(cut, text_.find(stop, from));
  }
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  text_finished_ = true;
  return true;
}

std::optional<std::string> SequenceSampler::accept(int32_t token, int64_t num_generated) {
  if (decoder_) {
    const int64_t old_size = int64_t(text_.size());
    text_ += decoder_->push(token);
    if (found_stop_string(old_size)) return "stop";
  }
  if (is_stop_token(token)) return "stop";
  if (num_generated >= spec_.stop.max_tokens) return "length";
  return std::nullopt;
}

void SequenceSampler::finish_text() {
  if (decoder_ && !text_finished_) text_ += decoder_->finish();
  text_finished_ = true;
}

}  // namespace jambo::engine
