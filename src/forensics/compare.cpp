#include "forensics/compare.h"

#include "core/error.h"
#include "core/json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace jambo::forensics {
namespace {

// Prompt and generated ids of each sample; none for a sample without generated ids (nothing to score).
std::vector<std::vector<int32_t>> sample_sequences(const std::vector<Sample>& samples) {
  std::vector<std::vector<int32_t>> sequences(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].ids.empty()) continue;
    sequences[i] = samples[i].prompt_ids;
    sequences[i].insert(sequences[i].end(), samples[i].ids.begin(), samples[i].ids.end());
  }
  return sequences;
}

}  // namespace

int64_t CompareSummary::num_flagged() const {
  return std::count_if(samples.begin(), samples.end(), [](const SampleComparison& c) { return c.flagged; });
}

int64_t CompareSummary::num_tokens() const {
  int64_t total = 0;
  for (const SampleComparison& comparison : samples) total += int64_t(comparison.abs_diffs.size());
  return total;
}

const SampleComparison* CompareSummary::worst() const {
  const SampleComparison* worst = nullptr;
  for (const SampleComparison& comparison : samples)
    if (!worst || comparison.max_abs_diff > worst->max_abs_diff) worst = &comparison;
  return worst;
}

SampleComparison compare_logprobs(Sample sample, std::span<const double> reference_logprobs, double threshold) {
  JAMBO_ASSERT(reference_logprobs.size() == sample.logprobs.size());
  SampleComparison out;
  double sum = 0.0;
  for (size_t i = 0; i < reference_logprobs.size(); ++i) {
    const double diff = std::abs(sample.logprobs[i] - reference_logprobs[i]);
    // A NaN compares false with everything, so it would pass every check: count it as infinite.
    const double abs_diff = std::isfinite(diff) ? diff : std::numeric_limits<double>::infinity();
    out.abs_diffs.push_back(abs_diff);
    sum += abs_diff;
    out.max_abs_diff = std::max(out.max_abs_diff, abs_diff);
    if (abs_diff > threshold && !out.first_divergent_position) out.first_divergent_position = int64_t(i);
  }
  if (!out.abs_diffs.empty()) out.mean_abs_diff = sum / double(out.abs_diffs.size());
  out.flagged = out.first_divergent_position.has_value();
  out.sample = std::move(sample);
  return out;
}

CompareSummary compare_samples(const model::Model& model, SampleFile file, double threshold,
                               const ReferenceOptions& reference,
                               const std::function<void(int64_t, int64_t)>& on_progress) {
  JAMBO_REQUIRE(std::isfinite(threshold) && threshold >= 0, "the threshold must be a finite number >= 0, got {}",
                threshold);
  CompareSummary summary;
  summary.threshold = threshold;
  summary.malformed_lines = std::move(file.malformed_lines);
  const auto name_of = [&](size_t i) {
    const Sample& sample = file.samples[i];
    return fmt::format("sample {} {} (line {})", describe_json(sample.id), sample.sample, sample.line_number);
  };
  const std::vector<std::vector<double>> scored =
      score_sequences(model, sample_sequences(file.samples), reference, on_progress, name_of);
  summary.samples.reserve(file.samples.size());
  for (size_t i = 0; i < file.samples.size(); ++i) {
    Sample& sample = file.samples[i];
    // The logprob of generated id j is under the logits of position num_prompt + j - 1.
    const std::span<const double> generated =
        std::span(scored[i]).subspan(scored[i].empty() ? 0 : sample.prompt_ids.size() - 1);
    summary.samples.push_back(compare_logprobs(std::move(sample), generated, threshold));
  }
  return summary;
}

nlohmann::json summary_json(const CompareSummary& summary) {
  nlohmann::json samples = nlohmann::json::array();
  double sum = 0.0;
  for (const SampleComparison& comparison : summary.samples) {
    sum += comparison.mean_abs_diff * double(comparison.abs_diffs.size());
    const std::optional<int64_t>& first = comparison.first_divergent_position;
    samples.push_back({{"id", comparison.sample.id},
                       {"sample", comparison.sample.sample},
                       {"line", comparison.sample.line_number},
                       {"num_tokens", comparison.abs_diffs.size()},
                       {"max_abs_diff", comparison.max_abs_diff},
                       {"mean_abs_diff", comparison.mean_abs_diff},
                       {"first_divergent_position", first ? nlohmann::json(*first) : nlohmann::json(nullptr)},
                       {"flagged", comparison.flagged}});
  }
  nlohmann::json malformed = nlohmann::json::array();
  for (const MalformedLine& line : summary.malformed_lines)
    malformed.push_back({{"line", line.line_number}, {"error", line.error}});
  const SampleComparison* worst = summary.worst();
  const int64_t num_tokens = summary.num_tokens();
  return {{"threshold", summary.threshold},
          {"num_samples", summary.samples.size()},
          {"num_flagged", summary.num_flagged()},
          {"num_tokens", num_tokens},
          {"max_abs_diff", worst ? worst->max_abs_diff : 0.0},
          {"mean_abs_diff", num_tokens > 0 ? sum / double(num_tokens) : 0.0},
          {"worst", worst ? nlohmann::json{{"id", worst->sample.id}, {"sample", worst->sample.sample}}
                          : nlohmann::json(nullptr)},
          {"num_malformed_lines", summary.malformed_lines.size()},
          {"malformed_lines", malformed},
          {"samples", samples}};
}

std::string describe_comparison(const CompareSummary& summary) {
  std::string text =
      fmt::format("{} of {} samples flagged (|Δ logprob| above {:g}); {} generated tokens compared",
                  summary.num_flagged(), summary.samples.size(), summary.threshold, summary.num_tokens());
  const SampleComparison* largest = summary.worst();
  if (largest && largest->max_abs_diff > 0.0) {
    const std::vector<double>& diffs = largest->abs_diffs;
    const Sample& sample = largest->sample;
    text += fmt::format("; largest |Δ logprob| {:.3g} (id {}, sample {}, line {}, position {})", largest->max_abs_diff,
                        describe_json(sample.id), sample.sample, sample.line_number,
                        std::max_element(diffs.begin(), diffs.end()) - diffs.begin());
  } else {
    text += "; every |Δ logprob| is 0";
  }
  if (!summary.malformed_lines.empty())
    text += fmt::format("; {} malformed line{} skipped", summary.malformed_lines.size(),
                        summary.malformed_lines.size() == 1 ? "" : "s");
  return text;
}

int compare_exit_code(const CompareSummary& summary) { return summary.num_flagged() > 0 ? kFlaggedExitCode : 0; }

}  // namespace jambo::forensics
