// jambo trace: the life of one request from a --trace file: lifecycle events and its rows in each step.
#include "cli/common.h"
#include "forensics/trace_reader.h"

#include <fstream>

namespace jambo::cli {
namespace {

void run_trace(const std::string& path, const std::string& request_id) {
  std::ifstream file(path);
  JAMBO_REQUIRE(file, "cannot open trace file '{}'", path);
  const RequestLife life = read_request_life(file, request_id);
  JAMBO_REQUIRE(!life.lines.empty(), "{}: no event or row of request '{}'", path, request_id);
  for (const std::string& line : life.lines) fmt::print("{}\n", line);
  if (life.num_unreadable > 0) fmt::print(stderr, "{}: {} unreadable lines skipped\n", path, life.num_unreadable);
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto request_id = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand("trace", "print the life of one request from a --trace file");
  command->add_option("--input", *path, "JSONL trace written by batch or stress with --trace")->required();
  command->add_option("--request", *request_id, "the request's id")->required();
  command->callback([path, request_id] { run_trace(*path, *request_id); });
}

}  // namespace jambo::cli
