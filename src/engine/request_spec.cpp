#include "engine/request_spec.h"

#include <fmt/format.h>

#include <cmath>

namespace jambo::engine {
namespace {

std::optional<FieldError> check_token_ids(const std::vector<int32_t>& ids, const char* field, int64_t vocab_size) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab_size)
      return FieldError{field, fmt::format("holds {}, which is not a token id in [0, {})", id, vocab_size)};
  return std::nullopt;
}

std::optional<FieldError> check_sampling(const SamplingParams& sampling) {
  if (!std::isfinite(sampling.temperature) || sampling.temperature < 0.0)
    return FieldError{"temperature", fmt::format("must be >= 0, got {}", sampling.temperature)};
  if (sampling.top_k < 0) return FieldError{"top_k", fmt::format("must be >= 0 (0: no limit), got {}", sampling.top_k)};
  if (!(sampling.top_p > 0.0 && sampling.top_p <= 1.0))
    return FieldError{"top_p", fmt::format("must be in (0, 1], got {}", sampling.top_p)};
  if (!(sampling.min_p >= 0.0 && sampling.min_p <= 1.0))
    return FieldError{"min_p", fmt::format("must be in [0, 1], got {}", sampling.min_p)};
  return std::nullopt;
}

std::optional<FieldError> check_stop(const RequestSpec& spec, const RequestLimits& limits) {
  const StopRules& stop = spec.stop;
  const int64_t num_prompt = int64_t(spec.prompt_ids.size());
  if (stop.max_tokens < 0) return FieldError{"max_tokens", fmt::format("must be >= 0, got {}", stop.max_tokens)};
  if (stop.max_tokens > limits.max_model_len - num_prompt)
    return FieldError{"max_tokens", fmt::format("{} tokens do not fit: the prompt is {} tokens and max_model_len is {}",
                                                stop.max_tokens, num_prompt, limits.max_model_len)};
  if (auto error = check_token_ids(stop.token_ids, "stop_token_ids", limits.vocab_size)) return error;
  if (stop.strings.size() > kMaxStopStrings)
    return FieldError{"stop", fmt::format("holds {} strings; at most {}", stop.strings.size(), kMaxStopStrings)};
  for (const std::string& text : stop.strings) {
    if (text.empty()) return FieldError{"stop", "holds an empty string"};
    if (text.size() > kMaxStopLength)
      return FieldError{"stop", fmt::format("holds a string of {} bytes; at most {}", text.size(), kMaxStopLength)};
  }
  if (!stop.strings.empty() && !limits.has_tokenizer)
    return FieldError{"stop", "stop strings need the model's tokenizer.json"};
  return std::nullopt;
}

}  // namespace

std::optional<FieldError> validate(const RequestSpec& spec, const RequestLimits& limits) {
  if (spec.prompt_ids.empty()) return FieldError{"prompt", "is empty: give at least one token"};
  if (int64_t(spec.prompt_ids.size()) > limits.max_model_len)
    return FieldError{"prompt", fmt::format("is {} tokens; the context (max_model_len) is {} tokens",
                                            spec.prompt_ids.size(), limits.max_model_len)};
  if (auto error = check_token_ids(spec.prompt_ids, "prompt", limits.vocab_size)) return error;
  if (spec.n < 1 || spec.n > limits.max_n)
    return FieldError{"n", fmt::format("must be between 1 and {}, got {}", limits.max_n, spec.n)};
  if (auto error = check_sampling(spec.sampling)) return error;
  if (auto error = check_stop(spec, limits)) return error;
  if (spec.num_top_logprobs < 0 || spec.num_top_logprobs > kMaxLogprobs)
    return FieldError{"logprobs", fmt::format("must be between 0 and {}, got {}", kMaxLogprobs, spec.num_top_logprobs)};
  if (spec.num_prompt_logprobs && (*spec.num_prompt_logprobs < 0 || *spec.num_prompt_logprobs > kMaxLogprobs))
    return FieldError{"prompt_logprobs",
                      fmt::format("must be between 0 and {}, got {}", kMaxLogprobs, *spec.num_prompt_logprobs)};
  return std::nullopt;
}

}  // namespace jambo::engine
