// Picks the next token from a logits vector: greedy at temperature 0, otherwise seeded sampling
// after temperature, top-k and top-p filtering. Reported logprobs are always those of the model's
// unmodified distribution.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>

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
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// The highest logit; ties go to the lowest id.
int32_t argmax(std::span<const float> logits);

}  // namespace jambo
