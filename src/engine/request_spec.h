// The one request contract: what a caller may ask of the engine, each field in one place, and the one validation
// that every front end (the server, `jambo batch`, `jambo generate`) and the engine itself call. Errors name the
// field by its wire name, as the server's completions API and batch's input lines spell it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace jambo::engine {

// How each token is chosen. The choice itself is made by the backend, where the logits are (backend/logits_ops.h);
// reported logprobs are always those of the model's unmodified distribution.
struct SamplingParams {
  double temperature = 0.0;      // 0: greedy
  int64_t top_k = 0;             // 0: no limit
  double top_p = 1.0;            // 1: no limit
  double min_p = 0.0;            // drop tokens less likely than min_p * p(top token)
  std::optional<uint64_t> seed;  // unset: a random seed
};

// When a sample ends: at EOS (unless ignore_eos), a stop token, a stop string, or after max_tokens tokens.
struct StopRules {
  int64_t max_tokens = 16;
  std::vector<int32_t> token_ids;    // besides the model's EOS
  std::vector<std::string> strings;  // need a tokenizer; cut from the text with what follows
  bool ignore_eos = false;           // keep generating past EOS (benchmarks, reference checks)
};

// One input request: a line of `jambo batch` input, one prompt of an HTTP request, or `jambo generate`.
struct RequestSpec {
  std::string id;                   // the caller's id, echoed in outputs and traces
  std::vector<int32_t> prompt_ids;  // non-empty
  int64_t n = 1;                    // samples of this prompt; the prompt is prefilled once
  SamplingParams sampling;
  StopRules stop;
  int64_t num_top_logprobs = 0;                // K most likely tokens reported per generated position
  std::optional<int64_t> num_prompt_logprobs;  // none, or K: the logprob of each prompt token plus its top-K
  bool return_routed_experts = false;          // the experts each MoE layer routed each token to (SampleOutput)
};

// What the engine, or the server in front of it, can take.
struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;   // prompt plus max_tokens
  int64_t max_n = 1;           // samples of one request at once
  bool has_tokenizer = false;  // stop strings need one
};

inline constexpr int64_t kMaxLogprobs = 20;  // top-K of generated and of prompt tokens
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopLength = 256;  // bytes of one stop string

struct FieldError {
  std::string field;    // the wire name: "temperature", "stop", "prompt", ...
  std::string message;  // what is wrong with it, e.g. "must be >= 0, got -1"
};

// The first field of spec that breaks the contract under these limits, or nothing.
std::optional<FieldError> validate(const RequestSpec& spec, const RequestLimits& limits);

}  // namespace jambo::engine
