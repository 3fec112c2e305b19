// Logprob comparison against the reference path: every sample is re-scored on its own (its own row, slot
// and KV blocks, a one-shot prefill of prompt + generated ids from zero state, the same weights) and its
// reported logprobs are checked against the reference's. State bugs show as spikes: a sample whose
// logprobs drift far from the reference.
#pragma once

#include "forensics/reference_scorer.h"
#include "forensics/sample_file.h"
#include "model/weights.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace jambo::forensics {

// A sample is flagged when one of its |Δ logprob| exceeds the threshold. On the CPU backend jambo's
// batched logprobs equal the reference bitwise (Δ = 0), and another engine computing in fp32 differs by
// rounding alone (up to ~1.4e-4 on the fixtures for transformers fp32 against float64), while a stale or
// wrong state moves logprobs by 1e-1 and more: 1e-3 sits between with an order of magnitude each side.
constexpr double kDefaultCompareThreshold = 1e-3;

struct SampleComparison {
  Sample sample;
  std::vector<double> abs_diffs;  // [num_generated] |engine - reference|; +inf where either is not finite
  double max_abs_diff = 0.0;      // 0 for a sample without generated ids
  double mean_abs_diff = 0.0;
  std::optional<int64_t> first_divergent_position;  // first generated position with |Δ| > threshold
  bool flagged = false;
};

struct CompareSummary {
  double threshold = kDefaultCompareThreshold;
  std::vector<SampleComparison> samples;       // in input order
  std::vector<MalformedLine> malformed_lines;  // skipped while reading

  int64_t num_flagged() const;
  int64_t num_tokens() const;  // generated ids compared, over all samples
  // The sample with the largest max |Δ| (the first of equals), or nullptr when there are none.
  const SampleComparison* worst() const;
};

// Compares one sample's logprobs with the reference's for its generated ids (both [num_generated]).
SampleComparison compare_logprobs(Sample sample, std::span<const double> reference_logprobs, double threshold);

// Re-scores every sample of the file through the reference path on reference.backend (score_sequences);
// the comparisons are in input order. on_progress(done, total) is called as samples are re-scored. Throws
// backend::NonFiniteLogits naming the sample (id, index, line) whose reference logits are not finite.
CompareSummary compare_samples(const model::Model& model, SampleFile file, double threshold,
                               const ReferenceOptions& reference = {},
                               const std::function<void(int64_t, int64_t)>& on_progress = {});

// The summary as JSON: totals, malformed lines and one entry per sample. A non-finite |Δ| is written
// as null (JSON has no infinity) and always flags its sample.
nlohmann::json summary_json(const CompareSummary& summary);

// The comparison in one line for people (compare's banner, the HTML report's verdict, stress's summary):
//   1 of 12 samples flagged (|Δ logprob| above 0.001); 3881 generated tokens compared; largest |Δ logprob| 2
//   (id "x", sample 0, line 7, position 5); 2 malformed lines skipped
// The largest |Δ| is named as the largest, flagged or not (position: of the sample's generated tokens, as in
// the JSON); when every |Δ| is 0 no sample is named. Malformed lines are counted only when there are some.
std::string describe_comparison(const CompareSummary& summary);

// The exit status of `jambo compare`: 3 when any sample is flagged, else 0.
constexpr int kFlaggedExitCode = 3;
int compare_exit_code(const CompareSummary& summary);

}  // namespace jambo::forensics
