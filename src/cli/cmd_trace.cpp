// jambo trace: the life of one request from a --trace file: lifecycle events and its rows in each step.
#include "cli/common.h"
#include "forensics/trace_reader.h"

#include <fstream>

namespace jambo::cli {
namespace {

struct TraceOptions {
  std::string path;
  std::string request_id;
  std::optional<int64_t> sequence_id;
  bool allow_skipped = false;
};

// Returns the exit status: skipped_lines_exit_code's, once the life is printed.
int run_trace(const TraceOptions& options) {
  std::ifstream file = open_input_file(options.path);
  const forensics::RequestLife life = options.sequence_id ? forensics::read_sequence_life(file, *options.sequence_id)
                                                          : forensics::read_request_life(file, options.request_id);
  const std::string skipped =
      life.num_unreadable == 0
          ? ""
          : fmt::format("{} unreadable lines skipped; the first, {}", life.num_unreadable, life.first_unreadable);
  JAMBO_REQUIRE(!life.lines.empty(), "{}: no event or row of {}{}", options.path,
                options.sequence_id ? fmt::format("sequence {}", *options.sequence_id)
                                    : fmt::format("request '{}'", options.request_id),
                skipped.empty() ? "" : " (" + skipped + ")");
  for (const std::string& line : life.lines) fmt::print("{}\n", line);
  if (life.num_unreadable > 0) fmt::print(stderr, "{}: {}\n", options.path, skipped);
  return skipped_lines_exit_code("trace", life.num_unreadable, options.allow_skipped);
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto options = std::make_shared<TraceOptions>();
  CLI::App* command = app.add_subcommand("trace", "print the life of one request from a --trace file");
  command->add_option("--input", options->path, "JSONL trace written with --trace (batch, stress, serve)")->required();
  CLI::Option* request = command->add_option("--request", options->request_id, "the request's id (all its samples)");
  CLI::Option* sequence = command->add_option("--sequence", options->sequence_id,
                                              "the engine's sequence id, as backend and law-2 errors name it");
  request->excludes(sequence);
  add_allow_skipped_flag(*command, options->allow_skipped);
  command->callback([options, request, sequence] {
    if (request->count() == 0 && sequence->count() == 0) throw UsageError("give --request or --sequence");
    if (const int status = run_trace(*options); status != 0) throw ExitStatus{status};
  });
}

}  // namespace jambo::cli
