// What a step returns from its logits, computed on the host: log-softmax, top-K, target logprobs and the
// token choice (greedy or seeded sampling after min-p, top-k and top-p). The CPU backend's outputs, and the
// twin that the CUDA backend's logits kernels are tested against (and fall back to for rare choices).
#pragma once

#include "backend/backend.h"

#include <span>
#include <vector>

namespace jambo::backend {

// The top_k that restricts a choice's candidates: 0 when top_k is 0 or keeps the whole vocabulary anyway.
int64_t restricting_top_k(const TokenChoice& choice, int64_t vocab_size);

// The highest logit; ties go to the lower id.
int32_t argmax(std::span<const float> logits);

// log(sum(exp(logits))) computed in double with the max subtracted first.
double log_sum_exp(std::span<const float> logits);

// The K most likely tokens, most likely first; ties go to the lower id (like a stable sort).
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int64_t k);

// The token `choice` picks from one logits vector, with its logprob and the top K.
ChosenToken choose_token(std::span<const float> logits, const TokenChoice& choice);

// The same given the vector's log(sum(exp(logits))): a backend that computed the normalizer elsewhere (the CUDA
// backend, on the GPU) reports every logprob of the vector against that one normalizer.
ChosenToken choose_token_given(std::span<const float> logits, const TokenChoice& choice, double normalizer);

// Throws jambo::Error naming the first field of the choice out of range.
void validate_choice(const TokenChoice& choice);

// A row's output from its computed logits vectors ([num_vectors, vocab_size]: every position's when
// computes_all_vectors(row), else the last token's alone).
RowOutput row_output(const BatchRow& row, std::span<const float> vectors, int64_t vocab_size);

// The step's output from the logits vectors its rows computed ([num_vectors, vocab_size], rows in order,
// computes_all_vectors(row) ? num_tokens : 1 vectors each): every row's output and the copies asked for.
void fill_step_output(std::span<const BatchRow> rows, std::span<const float> vectors, int64_t vocab_size,
                      StepOutput& output);

}  // namespace jambo::backend
