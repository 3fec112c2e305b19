// jambo batch: the offline mode for RL rollouts. Reads request lines, runs them all through the engine
// with continuous batching, appends one line per finished sample to the output as it finishes, and can
// be interrupted and rerun: ids whose samples are all in the output already are skipped. --shard I/N runs
// the I-th of N disjoint slices of the request lines (data-parallel rollouts: one engine per GPU or host, each
// with its own output, merged by concatenation).
#include "cli/common.h"
#include "cli/input_lines.h"
#include "cli/progress.h"
#include "engine/request_json.h"

#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace jambo::cli {
namespace {

// Request line k (counting non-blank lines from 0) belongs to shard k mod count.
struct Shard {
  int64_t index = 0, count = 1;
  bool owns(int64_t request_line) const { return request_line % count == index; }
};

struct BatchOptions {
  ModelOptions model;
  EngineFlags engine;
  std::string input_path;
  std::string output_path;
  engine::RequestSpec defaults;
  bool allow_skipped = false;
  std::string shard_text;  // --shard I/N as given
  Shard shard;
};

bool parse_whole(std::string_view text, int64_t& out) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && error == std::errc() && end == text.data() + text.size();
}

Shard parse_shard(std::string_view text) {
  Shard shard;
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos || !parse_whole(text.substr(0, slash), shard.index) ||
      !parse_whole(text.substr(slash + 1), shard.count) || shard.index < 0 || shard.index >= shard.count)
    throw UsageError(fmt::format("--shard must be I/N with 0 <= I < N (e.g. 0/4), got '{}'", text));
  return shard;
}

using SamplesWritten = std::map<std::string, std::set<int64_t>>;  // id -> sample indices in the output

// Reads what an earlier, possibly interrupted, run wrote; a torn last line is ignored. Only a regular file is
// read back: a FIFO or a device would block.
SamplesWritten read_samples_written(const std::string& path) {
  SamplesWritten written;
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) return written;
  JAMBO_REQUIRE(std::filesystem::is_regular_file(status),
                "output file '{}' is not a regular file: batch appends to it and reads it back to resume", path);
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    nlohmann::json sample;
    try {
      sample = parse_json(line);
    } catch (const Error&) {
      continue;
    }
    if (sample.is_object() && sample.contains("id") && sample["id"].is_string() && sample.contains("sample") &&
        sample["sample"].is_number_integer())
      written[sample["id"].get<std::string>()].insert(sample["sample"].get<int64_t>());
  }
  return written;
}

// The length of the file up to and including its last newline: what an interrupted run wrote whole.
uintmax_t whole_lines_length(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) return 0;
  constexpr std::streamoff kChunk = 1 << 16;
  for (std::streamoff end = file.tellg(); end > 0;) {
    const std::streamoff begin = std::max<std::streamoff>(0, end - kChunk);
    std::string chunk(size_t(end - begin), '\0');
    file.seekg(begin);
    file.read(chunk.data(), std::streamsize(chunk.size()));
    if (const size_t newline = chunk.rfind('\n'); newline != std::string::npos) return uintmax_t(begin) + newline + 1;
    end = begin;
  }
  return 0;
}

// Opens the output for appending, first cutting a torn last line (an interrupted write) away.
std::ofstream open_output(const std::string& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    const uintmax_t whole = whole_lines_length(path);
    if (whole < std::filesystem::file_size(path)) {
      fmt::print(stderr, "{}: cutting a torn last line left by an interrupted run\n", path);
      std::filesystem::resize_file(path, whole);
    }
  }
  std::ofstream out(path, std::ios::app);
  JAMBO_REQUIRE(out, "cannot write output file '{}'", path);
  return out;
}

}  // namespace

engine::RequestSpec parse_batch_line(const std::string& line, int64_t line_number, engine::RequestSpec defaults,
                                     const tokenizer::Tokenizer* tokenizer) {
  const nlohmann::json object = parse_json(line);
  defaults.id = std::to_string(line_number);
  return engine::request_from_json(object, defaults, tokenizer);
}

namespace {

struct BatchInput {
  std::vector<engine::RequestSpec> requests;
  std::vector<int64_t> line_numbers;  // [requests]
  int64_t num_malformed = 0;
  int64_t num_already_done = 0;
};

// The id of another shard's line, so that ids stay unique across the whole file; none where the line is malformed
// (its own shard reports it).
std::optional<std::string> id_of_line(const std::string& line, int64_t line_number) {
  try {
    return engine::request_id(parse_json(line), std::to_string(line_number));
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Parses every line of this shard; a bad line is reported with its number and skipped, never stopping the rest.
BatchInput read_batch_input(const BatchOptions& options, const tokenizer::Tokenizer* tokenizer,
                            const SamplesWritten& written) {
  std::ifstream file = open_input_file(options.input_path);
  BatchInput input;
  std::set<std::string> seen_ids;
  std::string line;
  int64_t request_line = 0;
  for (int64_t line_number = 1; std::getline(file, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!options.shard.owns(request_line++)) {
      if (const std::optional<std::string> id = id_of_line(line, line_number)) seen_ids.insert(*id);
      continue;
    }
    try {
      engine::RequestSpec spec = parse_batch_line(line, line_number, options.defaults, tokenizer);
      JAMBO_REQUIRE(seen_ids.insert(spec.id).second, "id '{}' appears on an earlier line", spec.id);
      const auto done = written.find(spec.id);
      if (done != written.end() && int64_t(done->second.size()) >= spec.n) {
        ++input.num_already_done;
        continue;
      }
      input.requests.push_back(std::move(spec));
      input.line_numbers.push_back(line_number);
    } catch (const Error& error) {
      report_skipped_line(options.input_path, line_number, error.what());
      ++input.num_malformed;
    }
  }
  return input;
}

// Returns the exit status (skipped_lines_exit_code).
int run_batch(BatchOptions& options) {
  const engine::EngineOptions& engine_options = options.engine.options;
  const model::Model model = options.model.load(engine_options.backend.kind);
  const std::optional<tokenizer::Tokenizer> tokenizer = options.model.load_tokenizer();
  const SamplesWritten written = read_samples_written(options.output_path);
  BatchInput input = read_batch_input(options, tokenizer ? &*tokenizer : nullptr, written);

  engine::Engine engine(model, tokenizer ? &*tokenizer : nullptr, engine_options);
  std::map<std::string, int64_t> samples_left;  // id -> samples still to finish
  for (size_t i = 0; i < input.requests.size(); ++i) {
    try {
      engine.add_request(input.requests[i]);
      samples_left[input.requests[i].id] = input.requests[i].n;
    } catch (const Error& error) {
      report_skipped_line(options.input_path, input.line_numbers[i], error.what());
      ++input.num_malformed;
    }
  }

  std::ofstream out = open_output(options.output_path);
  Progress progress(int64_t(samples_left.size()), isatty(STDERR_FILENO));
  int64_t num_generated = 0;
  const std::string backend = engine::describe(engine_options.backend);
  while (engine.has_unfinished()) {
    for (const engine::SampleOutput& sample : engine.step()) {
      num_generated += int64_t(sample.ids.size());
      const auto done = written.find(sample.id);
      if (done == written.end() || !done->second.count(sample.sample))
        out << sample_to_json(sample, backend).dump() << '\n' << std::flush;
      if (--samples_left[sample.id] == 0) progress.request_done();
    }
    progress.update(num_generated);
  }
  progress.finish(num_generated);

  const engine::EngineCounters& counters = engine.counters();
  const double elapsed = progress.elapsed_seconds();
  fmt::print(stderr,
             "batch: {}{} requests run, {} already done, {} skipped as malformed; {} tokens generated, {} prompt "
             "tokens computed in {:.1f} s: {:.1f} generated tok/s, {:.1f} tok/s in all; {} preemptions, {} slot "
             "reuses, {} steps ({:.1f} s in the backend's forward calls, {:.2f} ms a step outside them); {}\n",
             options.shard.count > 1 ? fmt::format("shard {}, ", options.shard_text) : "", samples_left.size(),
             input.num_already_done, input.num_malformed, num_generated, counters.prefill_tokens,
             elapsed, progress.tokens_per_second(num_generated),
             progress.tokens_per_second(num_generated + counters.prefill_tokens), counters.preemptions,
             counters.slot_reuses, counters.steps, counters.forward_seconds,
             counters.steps == 0 ? 0.0 : (elapsed - counters.forward_seconds) / double(counters.steps) * 1e3,
             describe_prefix_cache(counters, engine.prefix_caching_status()));
  return skipped_lines_exit_code("batch", input.num_malformed, options.allow_skipped);
}

}  // namespace

void add_batch_command(CLI::App& app) {
  auto options = std::make_shared<BatchOptions>();
  CLI::App* command = app.add_subcommand("batch", "offline batch generation for rollouts (JSONL in, JSONL out)");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  command->add_option("--input", options->input_path,
                      "JSONL lines {\"id\", \"prompt\" or \"prompt_ids\", \"n\", \"max_tokens\", \"temperature\", "
                      "\"top_p\", \"top_k\", \"min_p\", \"seed\", \"logprobs\", \"prompt_logprobs\", \"stop\", "
                      "\"stop_token_ids\"}; fields override the flags")
      ->required();
  command->add_option("--output", options->output_path, "JSONL, one line per sample; appended to, so a rerun resumes")
      ->required();
  command->add_option("--n", options->defaults.n, "samples per prompt")->capture_default_str();
  add_request_flags(*command, options->defaults);
  command->add_option("--logprobs", options->defaults.num_top_logprobs, "top-K logprobs per generated token");
  command->add_option("--shard", options->shard_text,
                      "I/N: run only the I-th of N disjoint slices of the request lines (line k, counting non-blank "
                      "lines from 0, belongs to shard k mod N; 0 <= I < N), for one engine per GPU or host; give each "
                      "shard its own --output and concatenate them");
  options->engine.add_to(*command);
  add_allow_skipped_flag(*command, options->allow_skipped);
  command->callback([options] {
    validate_request_flags(options->defaults);
    if (!options->shard_text.empty()) options->shard = parse_shard(options->shard_text);
    if (const int status = run_batch(*options); status != 0) throw ExitStatus{status};
  });
}

}  // namespace jambo::cli
