#include "forensics/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>

namespace jambo::forensics {
namespace {

using svg::append;
using svg::axis_labels;
using svg::kBottom;
using svg::kLeft;
using svg::kRight;
using svg::kTop;
using svg::tick_step;
using svg::x_tick;
using svg::y_tick;

constexpr int64_t kMaxMalformedLinesShown = 20;

const char* const kStyle = R"(body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
.verdict{padding:.8em 1em;border-radius:6px;font-size:1.2em}.clean{background:#e3f4e1}.flagged{background:#fbe0e0}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}
.text{font-family:monospace;white-space:pre-wrap;word-break:break-all}.after{color:#999}
mark{background:#f66;color:#000}svg text{font-size:12px}.caption{color:#555}
)";

std::string id_text(const nlohmann::json& id) { return id.is_string() ? id.get<std::string>() : id.dump(); }

std::string format_diff(double value) { return std::isfinite(value) ? fmt::format("{:.3g}", value) : "inf"; }

// A base-10 log scale over whole decades: fraction() is 0 at 10^min_decade, 1 at 10^max_decade (and
// beyond, infinity included). Its bottom line stands for zero: every non-zero value lies above it.
struct LogScale {
  int min_decade = -4;
  int max_decade = -2;

  double fraction(double value) const {
    if (!(value > 0)) return 0.0;
    return std::clamp((std::log10(value) - min_decade) / (max_decade - min_decade), 0.0, 1.0);
  }
  std::string label(int decade) const { return decade == min_decade ? "0" : fmt::format("1e{}", decade); }
};

// Spans the threshold and every finite, non-zero max |Δ|, with the decade below the smallest for zero.
LogScale log_scale_for(const CompareSummary& summary) {
  double smallest = INFINITY, largest = 0.0;
  const auto include = [&](double value) {
    if (!(value > 0) || !std::isfinite(value)) return;
    smallest = std::min(smallest, value);
    largest = std::max(largest, value);
  };
  include(summary.threshold);
  for (const SampleComparison& comparison : summary.samples) include(comparison.max_abs_diff);
  if (largest == 0.0) return {};
  return {int(std::floor(std::log10(smallest))) - 1, int(std::floor(std::log10(largest))) + 1};
}

// max |Δ| of each sample in input order on a log axis, the threshold as a dashed line, flagged samples red.
std::string spike_plot_svg(const CompareSummary& summary, const LogScale& scale) {
  const int64_t num_samples = int64_t(summary.samples.size());
  const auto x = [&](int64_t index) { return kLeft + (double(index) + 0.5) / double(num_samples) * (kRight - kLeft); };
  const auto y = [&](double value) { return kBottom - scale.fraction(value) * (kBottom - kTop); };
  std::string out;
  svg::open(out, "max |Δ logprob| per sample");
  const int label_every = std::max(1, (scale.max_decade - scale.min_decade + 7) / 8);
  for (int decade = scale.min_decade; decade <= scale.max_decade; ++decade)
    y_tick(out, y(std::pow(10.0, decade)), (decade - scale.min_decade) % label_every == 0 ? scale.label(decade) : "");
  const int64_t step = tick_step(num_samples - 1, 10);
  for (int64_t index = 0; index < num_samples; index += step) x_tick(out, x(index), std::to_string(index));
  append(out, R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#d62728" stroke-dasharray="6 4"/>)", kLeft,
         y(summary.threshold), kRight, y(summary.threshold));
  append(out, R"(<text x="{}" y="{:.1f}" text-anchor="end" fill="#d62728">threshold {}</text>)", kRight - 4,
         y(summary.threshold) - 4, format_diff(summary.threshold));
  for (bool flagged : {false, true}) {  // flagged points last, so that they are drawn on top
    for (int64_t index = 0; index < num_samples; ++index) {
      const SampleComparison& comparison = summary.samples[index];
      if (comparison.flagged != flagged) continue;
      const char* color = flagged ? "#d62728" : "#4a78b5";
      append(out, R"(<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2:.1f}" stroke="{3}" stroke-opacity="0.5"/>)",
             x(index), kBottom, y(comparison.max_abs_diff), color);
      append(out,
             R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>id {} sample {}: max |Δ| {}</title></circle>)",
             x(index), y(comparison.max_abs_diff), color, html_escape(id_text(comparison.sample.id)),
             comparison.sample.sample, format_diff(comparison.max_abs_diff));
    }
  }
  axis_labels(out, "sample (input order)", "max |Δ logprob| (log scale)");
  out += "</svg>\n";
  return out;
}

struct HistogramBin {
  std::string label;
  int64_t count = 0;
  int64_t num_flagged = 0;
};

// Bins of max |Δ|: exact zeros, one per decade of the scale, then infinite values.
std::vector<HistogramBin> histogram_bins(const CompareSummary& summary, const LogScale& scale) {
  std::vector<HistogramBin> bins{{"0"}};
  for (int decade = scale.min_decade + 1; decade < scale.max_decade; ++decade)
    bins.push_back({fmt::format("1e{}", decade)});
  bins.push_back({"inf"});
  const int64_t num_decades = scale.max_decade - scale.min_decade - 1;
  for (const SampleComparison& comparison : summary.samples) {
    const double value = comparison.max_abs_diff;
    const int64_t index = value == 0.0 ? 0
                          : !std::isfinite(value)
                              ? int64_t(bins.size()) - 1
                              : 1 + std::clamp<int64_t>(int64_t(std::floor(std::log10(value))) - scale.min_decade - 1,
                                                        0, num_decades - 1);
    bins[index].count += 1;
    bins[index].num_flagged += comparison.flagged ? 1 : 0;
  }
  return bins;
}

// Samples per decade of max |Δ|; the flagged part of each bar in red.
std::string histogram_svg(const CompareSummary& summary, const LogScale& scale) {
  const std::vector<HistogramBin> bins = histogram_bins(summary, scale);
  int64_t max_count = 1;
  for (const HistogramBin& bin : bins) max_count = std::max(max_count, bin.count);
  const double bin_width = (kRight - kLeft) / double(bins.size());
  const auto height = [&](int64_t count) { return double(count) / double(max_count) * (kBottom - kTop); };
  std::string out;
  svg::open(out, "histogram of max |Δ logprob|");
  const int64_t step = tick_step(max_count, 6);
  for (int64_t count = 0; count <= max_count; count += step)
    y_tick(out, kBottom - height(count), std::to_string(count));
  for (size_t i = 0; i < bins.size(); ++i) {
    const HistogramBin& bin = bins[i];
    const double left = kLeft + double(i) * bin_width + 4, width = bin_width - 8;
    const double clean_height = height(bin.count - bin.num_flagged), flagged_height = height(bin.num_flagged);
    append(out, R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#4a78b5"/>)", left,
           kBottom - clean_height, width, clean_height);
    append(out, R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#d62728"/>)", left,
           kBottom - clean_height - flagged_height, width, flagged_height);
    if (bin.count > 0)
      append(out, R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", left + width / 2,
             kBottom - height(bin.count) - 4, bin.count);
    x_tick(out, left + width / 2, bin.label);
  }
  axis_labels(out, "max |Δ logprob| (bin from 10^k up to 10^(k+1))", "samples");
  out += "</svg>\n";
  return out;
}

// The text of each id, in order; an id whose bytes complete a later id's character has empty text.
std::vector<std::string> token_texts(std::span<const int32_t> ids, const tokenizer::Tokenizer* tokenizer) {
  std::vector<std::string> texts;
  if (!tokenizer) {
    for (int32_t id : ids) texts.push_back(fmt::format("{} ", id));
    return texts;
  }
  tokenizer::IncrementalDecoder decoder(*tokenizer);
  for (int32_t id : ids) texts.push_back(decoder.push(id));
  if (!texts.empty()) texts.back() += decoder.finish();
  return texts;
}

// The generated text with the first divergent token marked and what follows it greyed.
std::string highlighted_text(const SampleComparison& comparison, const tokenizer::Tokenizer* tokenizer) {
  const std::vector<std::string> texts = token_texts(comparison.sample.ids, tokenizer);
  const int64_t marked = comparison.first_divergent_position.value_or(int64_t(texts.size()));
  std::string out;
  for (int64_t i = 0; i < int64_t(texts.size()); ++i) {
    if (i == marked) {
      append(out, R"(<mark title="position {}: |Δ| {}, engine logprob {:.6g}">{}</mark><span class="after">)", i,
             format_diff(comparison.abs_diffs[i]), comparison.sample.logprobs[i],
             texts[i].empty() ? fmt::format("[id {}]", comparison.sample.ids[i]) : html_escape(texts[i]));
    } else {
      out += html_escape(texts[i]);
    }
  }
  if (marked < int64_t(texts.size())) out += "</span>";
  return out;
}

std::string prompt_text(const Sample& sample, const tokenizer::Tokenizer* tokenizer) {
  if (tokenizer) return tokenizer->decode(sample.prompt_ids);
  return fmt::format("{}", fmt::join(sample.prompt_ids, " "));
}

// The samples with the largest non-zero max |Δ|, largest first.
std::string largest_differences_table(const CompareSummary& summary, const tokenizer::Tokenizer* tokenizer,
                                      int64_t max_rows) {
  std::vector<size_t> order(summary.samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return summary.samples[a].max_abs_diff > summary.samples[b].max_abs_diff;
  });
  std::string out;
  append(out,
         "<table><tr><th>#</th><th>id</th><th>sample</th><th>line</th><th>max |Δ|</th><th>mean |Δ|</th>"
         "<th>first divergent position</th><th>generated text (first divergent token marked)</th></tr>\n");
  int64_t num_rows = 0;
  for (size_t index : order) {
    const SampleComparison& comparison = summary.samples[index];
    if (num_rows == max_rows || comparison.max_abs_diff == 0.0) break;
    const std::optional<int64_t>& first = comparison.first_divergent_position;
    append(out, "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>", ++num_rows,
           html_escape(id_text(comparison.sample.id)), comparison.sample.sample, comparison.sample.line_number,
           format_diff(comparison.max_abs_diff), format_diff(comparison.mean_abs_diff),
           first ? std::to_string(*first) : "none");
    append(out, R"(<td class="text"><details><summary>prompt</summary>{}</details>{}</td></tr>)",
           html_escape(prompt_text(comparison.sample, tokenizer)), highlighted_text(comparison, tokenizer));
    out += "\n";
  }
  out += "</table>\n";
  if (num_rows == 0) out += "<p>Every sample's logprobs equal the reference's exactly.</p>\n";
  return out;
}

std::string headline(const CompareSummary& summary) {
  return fmt::format("<p class=\"verdict {}\">{}.</p>\n", summary.num_flagged() > 0 ? "flagged" : "clean",
                     html_escape(describe_comparison(summary)));
}

std::string malformed_lines_list(const CompareSummary& summary) {
  if (summary.malformed_lines.empty()) return "";
  std::string out = "<h2>Malformed lines (skipped)</h2>\n<ul>\n";
  const int64_t num_shown = std::min<int64_t>(summary.malformed_lines.size(), kMaxMalformedLinesShown);
  for (int64_t i = 0; i < num_shown; ++i)
    append(out, "<li>line {}: {}</li>\n", summary.malformed_lines[i].line_number,
           html_escape(summary.malformed_lines[i].error));
  if (int64_t(summary.malformed_lines.size()) > num_shown)
    append(out, "<li>and {} more (see the JSON summary)</li>\n", int64_t(summary.malformed_lines.size()) - num_shown);
  out += "</ul>\n";
  return out;
}

}  // namespace

std::string render_html_report(const CompareSummary& summary, const tokenizer::Tokenizer* tokenizer,
                               int64_t max_samples_listed) {
  const LogScale scale = log_scale_for(summary);
  std::string out;
  append(out,
         "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>jambo "
         "compare</title><style>{}</style></head><body>\n",
         kStyle);
  out += "<h1>jambo compare: logprobs against the reference path</h1>\n";
  out += headline(summary);
  if (!summary.samples.empty()) {
    out +=
        "<h2>Spike plot</h2>\n<p class=\"caption\">Each sample's largest |Δ logprob| against the reference "
        "(one request, one-shot prefill); red points exceed the threshold.</p>\n";
    out += spike_plot_svg(summary, scale);
    out += "<h2>Distribution</h2>\n";
    out += histogram_svg(summary, scale);
    out += "<h2>Largest differences</h2>\n";
    out += largest_differences_table(summary, tokenizer, max_samples_listed);
  }
  out += malformed_lines_list(summary);
  out += "</body></html>\n";
  return out;
}

}  // namespace jambo::forensics
