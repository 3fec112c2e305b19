// The sampling fields of a request and the seeded generator of one sample. The choice itself (greedy, or
// a draw after min-p, top-k and top-p) is made by the backend where the logits are (backend/logits_ops.h);
// the engine keeps the randomness: one draw of the sample's own generator per sampled token, so a sample
// depends on its seed alone, never on the batch it ran in. Reported logprobs are always those of the
// model's unmodified distribution.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <optional>
#include <random>

namespace jambo {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // 1: no limit
  std::optional<uint64_t> seed;  // unset: a random seed
  int64_t max_tokens = 16;
  int64_t num_top_logprobs = 0;  // K most likely tokens reported per generated position
  bool ignore_eos = false;       // keep generating past EOS (benchmarks, reference checks)

  // Throws jambo::Error naming the first field out of range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params, double min_p = 0.0);
  // How the next token is chosen; a sampled (temperature > 0) choice takes the generator's next draw.
  TokenChoice next_choice();

 private:
  SamplingParams params_;
  double min_p_;
  std::mt19937_64 rng_;
};

}  // namespace jambo
