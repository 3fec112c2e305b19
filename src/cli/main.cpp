// The `jambo` command. Exit codes:
//   0  success
//   1  a model folder, file or input could not be used (the message says which)
//   2  a bad option or value
//   3  compare or stress flagged a sample; it wins over 4
//   4  malformed input lines were skipped (score, batch, compare), unless --allow-skipped
//   5  the model's logits were not finite (NaN or infinity) for a request: the message names it and the step
// Malformed input lines, one policy for score, batch and compare: a malformed line is reported on
// stderr with its file, line number and what is wrong, and skipped; the run goes on, and at its end exits 4 if
// it skipped any line (0 with --allow-skipped); compare exits 1 when no line at all can be compared.
// kExitCodesHelp says the same in `jambo --help`.
#include "backend/nonfinite_logits.h"
#include "cli/command_line.h"
#include "cli/common.h"

#include <fmt/format.h>

#include <cstdio>

namespace {

constexpr const char* kExitCodesHelp =
    R"(Exit codes: 0 success; 1 a model folder, file or input could not be used (the message says which);
2 a bad option or value; 3 compare or stress flagged a sample; 4 malformed input lines were skipped;
5 the model's logits were not finite (NaN or infinity) for a request (the message names it and the step).
A malformed input line (score, batch, compare) is reported on stderr with its line number and what is
wrong, and skipped; the run goes on and exits 4 at the end, or 0 with --allow-skipped. When compare
both flags a sample and skips a line, it exits 3.)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"jambo: an inference engine for Jamba hybrid Mamba/attention models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  app.set_version_flag("--version", std::string("jambo ") + JAMBO_VERSION, "print the version and exit");
  app.footer(kExitCodesHelp);
  jambo::cli::add_score_command(app);
  jambo::cli::add_generate_command(app);
  jambo::cli::add_tokenize_commands(app);
  jambo::cli::add_bench_command(app);
  jambo::cli::add_compare_command(app);
  jambo::cli::add_batch_command(app);
  jambo::cli::add_trace_command(app);
  jambo::cli::add_stress_command(app);
  jambo::cli::add_serve_command(app);
  jambo::cli::make_numeric_options_strict(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& help_or_version) {
    return app.exit(help_or_version);
  } catch (const jambo::cli::ExitStatus& status) {
    return status.code;
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "jambo: error: {} (see --help)\n", jambo::cli::describe_parse_error(app, error));
    return 2;
  } catch (const jambo::cli::UsageError& error) {
    fmt::print(stderr, "jambo: error: {} (see --help)\n", error.what());
    return 2;
  } catch (const jambo::backend::NonFiniteLogits& error) {
    fmt::print(stderr, "jambo: error: {}\n", error.what());
    return jambo::cli::kNonFiniteLogitsExitCode;
  } catch (const std::exception& error) {  // jambo::Error, and what the standard library throws
    fmt::print(stderr, "jambo: error: {}\n", error.what());
    return 1;
  }
  return 0;
}
