// The scenario the tensor-parallel tests of both backends run: chunked prefills, decode steps of several sequences
// and a state copied to a fork, with every position's logits.
#pragma once

#include "support/sequences.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace jambo::testing {

// The fixture checkpoints (tests/fixtures/models) the tensor-parallel tests split.
inline const std::vector<std::string> kSplitFixtures = {
    "attn-heavy-tied-bf16", "dense-gqa1-projbias-fp32", "fused-experts-fp32", "moe-top1-mqa-tied-bf16",
    "moe-top2-gqa2-fp32",   "mqa-top2-tied-fp32",       "sharded-gqa4-bf16"};

// Two sequences: the first prefilled in chunks of 5 and 9 tokens beside the second's 7 and 2, then both decoded
// together; the first's state and KV blocks copied to a third sequence, which decodes beside it. Every position's
// logits, sequence by sequence (a backend of testing::test_cache(3)).
inline std::vector<Logits> run_split_scenario(backend::Backend& backend, int64_t vocab_size) {
  const std::vector<int32_t> tokens = random_tokens(20, vocab_size, 5);
  Sequence first(0, tokens), second(1, random_tokens(14, vocab_size, 6)), fork(2, tokens);
  std::vector<Logits> logits(3);
  step(backend, {&first, &second}, {5, 7}, {&logits[0], &logits[1]});
  step(backend, {&first, &second}, {9, 2}, {&logits[0], &logits[1]});
  for (int i = 0; i < 3; ++i) step(backend, {&first, &second}, {1, 1}, {&logits[0], &logits[1]});
  backend.copy_state(first.slot, fork.slot);
  for (int64_t b = 0; b < backend::kv_blocks_for(first.num_computed, kBlockSize); ++b)
    backend.copy_kv_block(first.block_table[size_t(b)], fork.block_table[size_t(b)]);
  fork.num_computed = first.num_computed;
  for (int i = 0; i < 3; ++i) step(backend, {&first, &fork}, {1, 1}, {&logits[0], &logits[2]});
  return logits;
}

// A probe's logits by itself on `alone`, and beside two other sequences on `batched` (a twin of `alone`): a prompt of
// 12 tokens, then 3 decode steps, 15 positions each.
inline std::pair<Logits, Logits> run_alone_and_batched(backend::Backend& alone, backend::Backend& batched,
                                                       int64_t vocab_size) {
  const std::vector<int32_t> tokens = random_tokens(15, vocab_size, 8);  // the prefill's and the decodes'
  Sequence probe(0, tokens), probe_again(0, tokens), other(1, random_tokens(12, vocab_size, 9)),
      third(2, random_tokens(7, vocab_size, 10));
  Logits by_itself, among_others, unused;
  step(alone, {&probe}, {12}, {&by_itself});
  step(batched, {&other, &probe_again, &third}, {9, 12, 4}, {&unused, &among_others, &unused});
  for (int i = 0; i < 3; ++i) {
    step(alone, {&probe}, {1}, {&by_itself});
    step(batched, {&other, &probe_again, &third}, {1, 1, 1}, {&unused, &among_others, &unused});
  }
  return {by_itself, among_others};
}

// The largest |logit| of a sequence's positions.
inline double largest_magnitude(const Logits& logits) {
  double largest = 0;
  for (const std::vector<float>& vector : logits)
    for (float value : vector) largest = std::max(largest, double(std::fabs(value)));
  return largest;
}

// The largest logprob difference over every position of every sequence.
inline double max_logprob_difference(const std::vector<Logits>& a, const std::vector<Logits>& b) {
  double worst = 0;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t p = 0; p < a[s].size(); ++p) worst = std::max(worst, max_logprob_difference(a[s][p], b[s][p]));
  return worst;
}

}  // namespace jambo::testing
