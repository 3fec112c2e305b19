// jambo score: teacher-forced log-probabilities of token sequences or texts, one JSON line per input line.
#include "cli/common.h"
#include "cli/input_lines.h"
#include "engine/request_json.h"
#include "forensics/sequence_runner.h"

#include <algorithm>
#include <fstream>
#include <iostream>

namespace jambo::cli {
namespace {

struct ScoreOptions {
  ModelOptions model;
  engine::BackendChoice backend;
  std::string input_path;
  std::string output_path;
  int64_t num_top_logprobs = 0;
  bool allow_skipped = false;
};

std::vector<int32_t> token_ids_field(const nlohmann::json& tokens) {
  JAMBO_REQUIRE(tokens.is_array(), "field 'tokens' must be an array of ids, got {}", describe_json(tokens));
  std::vector<int32_t> ids;
  for (const nlohmann::json& token : tokens) {
    JAMBO_REQUIRE(token.is_number_integer(), "field 'tokens' holds a non-integer: {}", describe_json(token));
    const std::optional<int64_t> id = json_int64(token);
    JAMBO_REQUIRE(id && *id >= 0 && *id <= INT32_MAX, "token id {} is negative or too large", token.dump());
    ids.push_back(int32_t(*id));
  }
  return ids;
}

}  // namespace

ScoreInput parse_score_line(const std::string& line, int64_t line_number, const tokenizer::Tokenizer* tokenizer) {
  const nlohmann::json object = parse_json(line);
  JAMBO_REQUIRE(object.is_object(), "expected a JSON object");
  ScoreInput input;
  input.line_number = line_number;
  input.id = object.value("id", nlohmann::json(line_number));
  JAMBO_REQUIRE(input.id.is_string() || input.id.is_number_integer(), "field 'id' must be a string or an integer");
  const bool has_tokens = object.contains("tokens"), has_text = object.contains("text");
  JAMBO_REQUIRE(has_tokens || has_text, "no field 'tokens' (token ids) or 'text': give one of them");
  JAMBO_REQUIRE(!(has_tokens && has_text), "both fields 'tokens' and 'text': give one of them");
  if (has_tokens) {
    input.tokens = token_ids_field(object["tokens"]);
    return input;
  }
  const nlohmann::json& text = object["text"];
  JAMBO_REQUIRE(text.is_string(), "field 'text' must be a string, got {}", describe_json(text));
  JAMBO_REQUIRE(tokenizer, "field 'text' needs the model's tokenizer.json; give 'tokens' instead");
  input.tokens = tokenizer->encode(text.get<std::string>());
  input.from_text = true;
  return input;
}

namespace {

struct ScoreInputs {
  std::vector<ScoreInput> inputs;
  int64_t num_skipped = 0;  // malformed lines
};

// Reads every line; a malformed one is reported and skipped.
ScoreInputs read_score_inputs(const std::string& path, const tokenizer::Tokenizer* tokenizer) {
  std::ifstream file = open_input_file(path);
  ScoreInputs read;
  std::string line;
  for (int64_t line_number = 1; std::getline(file, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      read.inputs.push_back(parse_score_line(line, line_number, tokenizer));
    } catch (const Error& error) {
      report_skipped_line(path, line_number, error.what());
      ++read.num_skipped;
    }
  }
  return read;
}

// Skips, as malformed, the inputs with a token id outside the vocabulary (known once the model is loaded).
void skip_outside_vocabulary(ScoreInputs& read, int64_t vocab_size, const std::string& path) {
  std::erase_if(read.inputs, [&](const ScoreInput& input) {
    const auto outside =
        std::find_if(input.tokens.begin(), input.tokens.end(), [&](int32_t token) { return token >= vocab_size; });
    if (outside == input.tokens.end()) return false;
    report_skipped_line(path, input.line_number,
                        fmt::format("token id {} is outside the vocabulary (size {})", *outside, vocab_size));
    ++read.num_skipped;
    return true;
  });
}

nlohmann::json score_json(const ScoreInput& input, const forensics::ScoredSequence& scored, int64_t num_top_logprobs) {
  nlohmann::json logprobs = nlohmann::json::array();
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < input.tokens.size(); ++i) {
    logprobs.push_back(scored.logprobs[i] ? nlohmann::json(*scored.logprobs[i]) : nlohmann::json(nullptr));
    top.push_back(i == 0 ? nlohmann::json(nullptr) : engine::top_logprobs_to_json(scored.top_logprobs[i]));
  }
  nlohmann::json out = {{"id", input.id}, {"logprobs", logprobs}};
  if (input.from_text) out["tokens"] = input.tokens;
  if (num_top_logprobs > 0) out["top_logprobs"] = top;
  return out;
}

// Returns the exit status (skipped_lines_exit_code).
int run_score(const ScoreOptions& options) {
  std::ofstream file = open_output(options.output_path);
  const std::optional<tokenizer::Tokenizer> tokenizer = options.model.load_tokenizer();
  ScoreInputs read = read_score_inputs(options.input_path, tokenizer ? &*tokenizer : nullptr);
  const model::Model model = options.model.load(options.backend.kind);
  skip_outside_vocabulary(read, model.config.vocab_size, options.input_path);
  int64_t max_tokens = 1;
  for (const ScoreInput& input : read.inputs) max_tokens = std::max<int64_t>(max_tokens, int64_t(input.tokens.size()));
  SingleSequenceBackend single = make_single_sequence_backend(model, max_tokens, options.backend);
  forensics::SequenceRunner runner(*single.backend, single.cache, /*max_chunk_tokens=*/512);

  std::ostream& out = options.output_path.empty() ? std::cout : file;
  for (const ScoreInput& input : read.inputs) {
    const forensics::ScoredSequence scored = runner.score(
        input.tokens, options.num_top_logprobs,
        fmt::format("{}:{} (id {})", options.input_path, input.line_number, describe_json(input.id)));
    out << score_json(input, scored, options.num_top_logprobs).dump() << '\n' << std::flush;
  }
  return skipped_lines_exit_code("score", read.num_skipped, options.allow_skipped);
}

}  // namespace

void add_score_command(CLI::App& app) {
  auto options = std::make_shared<ScoreOptions>();
  CLI::App* command = app.add_subcommand("score", "teacher-forced log-probabilities of token sequences");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  add_backend_flags(*command, options->backend);
  command
      ->add_option("--input", options->input_path,
                   "JSONL lines {\"id\": ..., \"tokens\": [ids]} or {\"id\": ..., \"text\": \"...\"} (tokenized with "
                   "special tokens, as generate --prompt is; the output then gives the \"tokens\")")
      ->required();
  command->add_option("--output", options->output_path, "output JSONL (default: stdout)");
  command->add_option("--top-logprobs", options->num_top_logprobs, "K most likely tokens per position")
      ->check(CLI::Range(0, 100));
  add_allow_skipped_flag(*command, options->allow_skipped);
  command->callback([options] {
    if (const int status = run_score(*options); status != 0) throw ExitStatus{status};
  });
}

}  // namespace jambo::cli
