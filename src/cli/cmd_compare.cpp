// jambo compare: re-scores generated samples through the reference path and flags those whose logprobs
// diverge from it; a JSON summary on stdout (or --summary) and an HTML report with --report.
#include "cli/common.h"
#include "cli/progress.h"
#include "forensics/compare.h"
#include "forensics/report.h"

#include <fstream>

#include <unistd.h>

namespace jambo::cli {
namespace {

struct CompareCommandOptions {
  ModelOptions model;
  std::string input_path;
  std::optional<double> threshold;  // resolve_threshold's default where not given
  forensics::ReferenceOptions reference;
  std::string summary_path;
  std::string report_path;
  bool allow_skipped = false;
};

// The backend every sample names, or nullopt where one does not or they differ.
std::optional<std::string> samples_backend(const forensics::SampleFile& file) {
  std::optional<std::string> backend = file.samples.front().backend;
  for (const forensics::Sample& sample : file.samples)
    if (sample.backend != backend) return std::nullopt;
  return backend;
}

// Returns the exit status: kFlaggedExitCode when a sample is flagged, else skipped_lines_exit_code.
int run_compare(const CompareCommandOptions& options) {
  std::ifstream input = open_input_file(options.input_path);
  std::ofstream summary_file = open_output(options.summary_path);
  std::ofstream report_file = open_output(options.report_path);
  const model::Model model = options.model.load(options.reference.backend);
  forensics::SampleFile samples = forensics::read_sample_file(input, model.config.vocab_size);
  for (const forensics::MalformedLine& line : samples.malformed_lines)
    report_skipped_line(options.input_path, line.line_number, line.error);
  JAMBO_REQUIRE(!samples.samples.empty(), "{}: no sample to compare ({} malformed lines skipped)", options.input_path,
                samples.malformed_lines.size());

  const double threshold = resolve_threshold(options.threshold, samples_backend(samples), options.reference);
  ProgressLine progress("compare", "samples", isatty(STDERR_FILENO));
  const forensics::CompareSummary summary =
      compare_samples(model, std::move(samples), threshold, options.reference,
                      [&progress](int64_t done, int64_t total) { progress.update(done, total); });
  const std::string summary_text = summary_json(summary).dump(2) + "\n";
  if (options.summary_path.empty()) {
    fmt::print("{}", summary_text);
  } else {
    write_output(summary_file, options.summary_path, summary_text);
  }
  if (!options.report_path.empty()) {
    const std::optional<tokenizer::Tokenizer> tokenizer = options.model.load_tokenizer();
    write_output(report_file, options.report_path, render_html_report(summary, tokenizer ? &*tokenizer : nullptr));
  }
  fmt::print(stderr, "compare: {}\n", describe_comparison(summary));
  if (const int flagged = compare_exit_code(summary); flagged != 0) return flagged;  // 3 wins over 4
  return skipped_lines_exit_code("compare", int64_t(summary.malformed_lines.size()), options.allow_skipped);
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto options = std::make_shared<CompareCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "compare",
      "re-score generated samples through the reference path (each its own row, slot and KV blocks, a one-shot "
      "prefill from zero state; many per step) and flag those whose logprobs diverge; exit code 3 when any sample "
      "is flagged, even if malformed lines were skipped too (3 wins over 4)");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  command->add_option("--input", options->input_path, "JSONL samples (formats below)")->required();
  command
      ->add_option("--threshold", options->threshold,
                   "flag a sample when a generated token's |Δ logprob| exceeds this (0: any difference; jambo's CPU "
                   "backend matches its reference bitwise, fp32 engines differ by ~1e-4, state bugs by 1e-1 and more; "
                   "default: 0 where every sample names the reference's own bitwise-invariant backend, as jambo "
                   "batch's output does, else 1e-3)")
      ->check(CLI::NonNegativeNumber);
  add_reference_flags(*command, options->reference, /*prefix=*/"", /*defaults_from_engine=*/false);
  command->add_option("--summary", options->summary_path, "write the JSON summary to this file (default: stdout)");
  command->add_option("--report", options->report_path, "write a self-contained HTML report to this file");
  add_allow_skipped_flag(*command, options->allow_skipped);
  command->footer(forensics::kSampleFormatHelp);
  command->callback([options] {
    if (const int status = run_compare(*options); status != 0) throw ExitStatus{status};
  });
}

}  // namespace jambo::cli
