#include "backend/logits_ops.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace jambo::backend {
namespace {

bool more_likely(std::span<const float> logits, int32_t a, int32_t b) {
  return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

// Ids in the order the draw walks them: the top_k most likely (sorted), the whole vocabulary sorted when
// top_p needs the order, else every id in id order (sorting the vocabulary for each token is costly).
std::vector<int32_t> candidate_ids(std::span<const float> logits, const TokenChoice& choice) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto order = [&](int32_t a, int32_t b) { return more_likely(logits, a, b); };
  if (const int64_t top_k = restricting_top_k(choice, int64_t(logits.size())); top_k > 0) {
    std::partial_sort(ids.begin(), ids.begin() + top_k, ids.end(), order);
    ids.resize(size_t(top_k));
  } else if (choice.top_p < 1.0) {
    std::sort(ids.begin(), ids.end(), order);
  }
  return ids;
}

// Seeded sampling: probabilities at the temperature (min-p drops those below min_p times the top one), the
// smallest prefix of the candidates whose mass reaches top_p, and the candidate where the draw falls.
int32_t sample_token(std::span<const float> logits, const TokenChoice& choice) {
  const std::vector<int32_t> ids = candidate_ids(logits, choice);
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  // min-p at this temperature: p_i / p_max = exp((l_i - l_max) / T) must reach min_p.
  const double min_logit = choice.min_p > 0.0 ? max_logit + choice.temperature * std::log(choice.min_p)
                                              : -std::numeric_limits<double>::infinity();
  std::vector<double> probs(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double logit = logits[ids[i]];
    probs[i] = logit < min_logit ? 0.0 : std::exp((logit - max_logit) / choice.temperature);
    total += probs[i];
  }
  size_t num_kept = ids.size();
  if (choice.top_p < 1.0) {
    double mass = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      mass += probs[i] / total;
      if (mass >= choice.top_p) {
        num_kept = i + 1;
        break;
      }
    }
  }
  const double kept_total = std::accumulate(probs.begin(), probs.begin() + num_kept, 0.0);
  double target = choice.uniform * kept_total;
  for (size_t i = 0; i < num_kept; ++i) {
    target -= probs[i];
    if (target < 0.0) return ids[i];
  }
  return ids[num_kept - 1];
}

// The K most likely tokens given log(sum(exp(logits))), so a vector's normalizer is computed once.
std::vector<TokenLogprob> top_logprobs_given(std::span<const float> logits, int64_t k, double normalizer) {
  k = std::min<int64_t>(k, int64_t(logits.size()));
  if (k <= 0) return {};
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return more_likely(logits, a, b); });
  std::vector<TokenLogprob> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out[i] = {ids[i], double(logits[ids[i]]) - normalizer};
  return out;
}

}  // namespace

int64_t restricting_top_k(const TokenChoice& choice, int64_t vocab_size) {
  return choice.top_k > 0 && choice.top_k < vocab_size ? choice.top_k : 0;
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double log_sum_exp(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(double(logit) - double(max_logit));
  return double(max_logit) + std::log(sum);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int64_t k) {
  if (k <= 0 || logits.empty()) return {};
  return top_logprobs_given(logits, k, log_sum_exp(logits));
}

void validate_choice(const TokenChoice& choice) {
  JAMBO_REQUIRE(std::isfinite(choice.temperature) && choice.temperature >= 0.0,
                "temperature must be >= 0, got {}", choice.temperature);
  JAMBO_REQUIRE(choice.top_k >= 0, "top_k must be >= 0, got {}", choice.top_k);
  JAMBO_REQUIRE(choice.top_p > 0.0 && choice.top_p <= 1.0, "top_p must be in (0, 1], got {}", choice.top_p);
  JAMBO_REQUIRE(choice.min_p >= 0.0 && choice.min_p <= 1.0, "min_p must be in [0, 1], got {}", choice.min_p);
  JAMBO_REQUIRE(choice.uniform >= 0.0 && choice.uniform < 1.0, "the draw must be in [0, 1), got {}",
                choice.uniform);
  JAMBO_REQUIRE(choice.num_top_logprobs >= 0, "num_top_logprobs must be >= 0, got {}", choice.num_top_logprobs);
}

ChosenToken choose_token(std::span<const float> logits, const TokenChoice& choice) {
  return choose_token_given(logits, choice, log_sum_exp(logits));
}

ChosenToken choose_token_given(std::span<const float> logits, const TokenChoice& choice, double normalizer) {
  ChosenToken chosen;
  chosen.token = choice.temperature == 0.0 ? argmax(logits) : sample_token(logits, choice);
  chosen.logprob = double(logits[chosen.token]) - normalizer;
  chosen.top_logprobs = top_logprobs_given(logits, choice.num_top_logprobs, normalizer);
  return chosen;
}

RowOutput row_output(const BatchRow& row, std::span<const float> vectors, int64_t vocab_size) {
  const int64_t num_vectors = int64_t(vectors.size()) / vocab_size;
  JAMBO_ASSERT(num_vectors == (computes_all_vectors(row) ? int64_t(row.tokens.size()) : 1));
  const auto vector = [&](int64_t i) { return vectors.subspan(size_t(i * vocab_size), size_t(vocab_size)); };
  RowOutput out;
  out.finite = std::all_of(vectors.begin(), vectors.end(), [](float logit) { return std::isfinite(logit); });
  for (size_t i = 0; i < row.targets.size(); ++i) {
    const std::span<const float> logits = vector(int64_t(i));
    const double normalizer = log_sum_exp(logits);
    out.target_logprobs.push_back(double(logits[row.targets[i]]) - normalizer);
    if (row.num_top_logprobs > 0)
      out.target_top_logprobs.push_back(top_logprobs_given(logits, row.num_top_logprobs, normalizer));
  }
  if (row.choices.empty()) return out;
  const std::span<const float> last = vector(num_vectors - 1);
  const double normalizer = log_sum_exp(last);  // once for the n samples forking off one prompt
  for (const TokenChoice& choice : row.choices) out.chosen.push_back(choose_token_given(last, choice, normalizer));
  return out;
}

void fill_step_output(std::span<const BatchRow> rows, std::span<const float> vectors, int64_t vocab_size,
                      StepOutput& output) {
  output.vocab_size = vocab_size;
  output.rows.resize(rows.size());
  output.values.clear();
  output.first_vector.clear();
  size_t first = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t num_values =
        size_t(element_offset(computes_all_vectors(rows[r]) ? int64_t(rows[r].tokens.size()) : 1, vocab_size));
    JAMBO_ASSERT(first + num_values <= vectors.size());
    const std::span<const float> row_vectors = vectors.subspan(first, num_values);
    output.rows[r] = row_output(rows[r], row_vectors, vocab_size);
    const StepOutput::CopyTarget copies = output.add_copies(rows[r], int64_t(num_values) / vocab_size);
    std::copy_n(row_vectors.begin() + element_offset(copies.first_computed, vocab_size),
                element_offset(copies.num_copied, vocab_size), copies.values);
    first += num_values;
  }
  JAMBO_ASSERT(first == vectors.size());
}

}  // namespace jambo::backend
