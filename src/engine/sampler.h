// The seeded generator of one sample. The choice itself (greedy, or a draw after min-p, top-k and top-p) is made by
// the backend where the logits are (backend/logits_ops.h); the engine keeps the randomness: one draw of the
// sample's own generator per sampled token, so a sample depends on its seed alone, never on the batch it ran in.
#pragma once

#include "backend/backend.h"
#include "engine/request_spec.h"

#include <cstdint>
#include <random>

namespace jambo::engine {

class Sampler {
 public:
  // params must have passed validate() (request_spec.h).
  Sampler(const SamplingParams& params, int64_t num_top_logprobs);
  // How the next token is chosen; a sampled (temperature > 0) choice takes the generator's next draw.
  backend::TokenChoice next_choice();

 private:
  SamplingParams params_;
  int64_t num_top_logprobs_;
  std::mt19937_64 rng_;
};

}  // namespace jambo::engine
