// The HTML report of `jambo compare`: one self-contained page (inline CSS and SVG; no script, nothing
// fetched) read top-down: the verdict, the spike plot of max |Δ logprob| per sample, a histogram of
// the same values, and the samples of largest |Δ| with their text, the first divergent token highlighted.
#pragma once

#include "forensics/compare.h"
#include "forensics/svg_plot.h"
#include "tokenizer/tokenizer.h"

#include <string>
#include <string_view>

namespace jambo::forensics {

constexpr int64_t kDefaultMaxSamplesListed = 20;

// tokenizer turns ids into text; without one (nullptr) the texts show token ids.
std::string render_html_report(const CompareSummary& summary, const tokenizer::Tokenizer* tokenizer,
                               int64_t max_samples_listed = kDefaultMaxSamplesListed);

}  // namespace jambo::forensics
