// jambo score: teacher-forced log-probabilities of token sequences, one JSON line per input line.
#include "cli/common.h"
#include "engine/request_json.h"
#include "forensics/sequence_runner.h"

#include <fstream>
#include <iostream>

namespace jambo::cli {
namespace {

struct ScoreOptions {
  ModelOptions model;
  BackendChoice backend;
  std::string input_path;
  std::string output_path;
  int64_t num_top_logprobs = 0;
};

struct ScoreInput {
  nlohmann::json id;
  std::vector<int32_t> tokens;
};

// Reads {"id": ..., "tokens": [ids]} lines; an error names the file and line.
std::vector<ScoreInput> read_score_inputs(const std::string& path) {
  std::ifstream file = open_input_file(path);
  std::vector<ScoreInput> inputs;
  std::string line;
  for (int64_t line_number = 1; std::getline(file, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = [&] { return fmt::format("{}:{}", path, line_number); };
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      fail("{}: malformed JSON: {}", where(), error.what());
    }
    JAMBO_REQUIRE(object.is_object(), "{}: expected a JSON object", where());
    JAMBO_REQUIRE(object.contains("tokens") && object["tokens"].is_array(), "{}: field 'tokens' must be an array of ids",
                  where());
    ScoreInput input;
    input.id = object.value("id", nlohmann::json(line_number));
    JAMBO_REQUIRE(input.id.is_string() || input.id.is_number_integer(), "{}: field 'id' must be a string or an integer",
                  where());
    for (const nlohmann::json& token : object["tokens"]) {
      JAMBO_REQUIRE(token.is_number_integer(), "{}: field 'tokens' holds a non-integer: {}", where(), describe_json(token));
      const int64_t id = token.get<int64_t>();
      JAMBO_REQUIRE(id >= 0 && id <= INT32_MAX, "{}: token id {} is negative or too large", where(), id);
      input.tokens.push_back(int32_t(id));
    }
    inputs.push_back(std::move(input));
  }
  return inputs;
}

void check_vocabulary(const ScoreInput& input, int64_t vocab_size, const std::string& path) {
  for (int32_t token : input.tokens)
    JAMBO_REQUIRE(token < vocab_size, "{}: sequence {}: token id {} is outside the vocabulary (size {})", path,
                  input.id.dump(), token, vocab_size);
}

nlohmann::json score_json(const ScoreInput& input, const ScoredSequence& scored, int64_t num_top_logprobs) {
  nlohmann::json logprobs = nlohmann::json::array();
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < input.tokens.size(); ++i) {
    logprobs.push_back(scored.logprobs[i] ? nlohmann::json(*scored.logprobs[i]) : nlohmann::json(nullptr));
    top.push_back(i == 0 ? nlohmann::json(nullptr) : top_logprobs_to_json(scored.top_logprobs[i]));
  }
  nlohmann::json out = {{"id", input.id}, {"logprobs", logprobs}};
  if (num_top_logprobs > 0) out["top_logprobs"] = top;
  return out;
}

void run_score(const ScoreOptions& options) {
  JAMBO_REQUIRE(options.num_top_logprobs >= 0, "--top-logprobs must be >= 0");
  const std::vector<ScoreInput> inputs = read_score_inputs(options.input_path);
  const Model model = options.model.load(options.backend.kind);
  int64_t max_tokens = 1;
  for (const ScoreInput& input : inputs) {
    check_vocabulary(input, model.config.vocab_size, options.input_path);
    max_tokens = std::max<int64_t>(max_tokens, int64_t(input.tokens.size()));
  }
  SingleSequenceBackend single = make_single_sequence_backend(model, max_tokens, options.backend);
  SequenceRunner runner(*single.backend, single.cache, /*max_chunk_tokens=*/512);

  std::ofstream file;
  if (!options.output_path.empty()) {
    file.open(options.output_path);
    JAMBO_REQUIRE(file, "cannot write output file '{}'", options.output_path);
  }
  std::ostream& out = options.output_path.empty() ? std::cout : file;
  for (const ScoreInput& input : inputs) {
    const ScoredSequence scored = runner.score(input.tokens, options.num_top_logprobs);
    out << score_json(input, scored, options.num_top_logprobs).dump() << '\n' << std::flush;
  }
}

}  // namespace

void add_score_command(CLI::App& app) {
  auto options = std::make_shared<ScoreOptions>();
  CLI::App* command = app.add_subcommand("score", "teacher-forced log-probabilities of token sequences");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  add_backend_flags(*command, options->backend);
  command->add_option("--input", options->input_path, "JSONL lines {\"id\": ..., \"tokens\": [ids]}")->required();
  command->add_option("--output", options->output_path, "output JSONL (default: stdout)");
  command->add_option("--top-logprobs", options->num_top_logprobs, "K most likely tokens per position")
      ->check(CLI::Range(0, 100));
  command->callback([options] { run_score(*options); });
}

}  // namespace jambo::cli
