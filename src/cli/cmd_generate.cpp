// jambo generate: continues a prompt, streaming text as it is produced (or one JSON object with --json).
#include "cli/common.h"
#include "engine/request_json.h"
#include "forensics/sequence_runner.h"

#include <cstdio>
#include <sstream>

namespace jambo::cli {
namespace {

struct GenerateOptions {
  ModelOptions model;
  BackendChoice backend;
  std::string prompt;
  std::string prompt_ids;
  SamplingParams sampling;
  bool json = false;
};

std::vector<int32_t> parse_prompt_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    size_t end = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end != item.size() || id < 0 || id > INT32_MAX)
      throw UsageError(fmt::format("--prompt-ids: '{}' is not a token id", item));
    ids.push_back(int32_t(id));
  }
  if (ids.empty()) throw UsageError("--prompt-ids: no token ids given");
  return ids;
}

// Ids as text when the model folder has no tokenizer.
std::string ids_as_text(const std::vector<int32_t>& ids) { return fmt::format("{}", fmt::join(ids, " ")); }

void run_generate(GenerateOptions& options) {
  try {
    options.sampling.validate();
  } catch (const Error& error) {
    throw UsageError(error.what());
  }
  const Model model = options.model.load(options.backend.backend);
  const std::optional<Tokenizer> tokenizer = options.model.load_tokenizer();
  std::vector<int32_t> prompt;
  if (!options.prompt_ids.empty()) {
    prompt = parse_prompt_ids(options.prompt_ids);
  } else {
    JAMBO_REQUIRE(tokenizer, "--prompt needs {}/tokenizer.json; use --prompt-ids instead", options.model.folder);
    prompt = tokenizer->encode(options.prompt);
  }
  for (int32_t id : prompt)
    JAMBO_REQUIRE(id < model.config.vocab_size, "prompt token id {} is outside the vocabulary (size {})", id,
                  model.config.vocab_size);

  const int64_t max_length = model.config.max_position_embeddings;
  if (options.sampling.max_tokens > max_length - int64_t(prompt.size()))
    throw UsageError(fmt::format("the prompt ({} tokens) plus --max-tokens {} exceeds the model's {} positions",
                                 prompt.size(), options.sampling.max_tokens, max_length));
  SingleSequenceBackend single = make_single_sequence_backend(model, int64_t(prompt.size()) + options.sampling.max_tokens,
                                                             options.backend);
  SequenceRunner runner(*single.backend, single.cache, /*max_chunk_tokens=*/512);
  std::optional<IncrementalDecoder> stream;
  if (tokenizer && !options.json) stream.emplace(*tokenizer, /*skip_special_tokens=*/true);
  const auto print_token = [&](int32_t id) {
    if (options.json) return;
    fmt::print("{}", stream ? stream->push(id) : fmt::format("{} ", id));
    std::fflush(stdout);
  };
  const GenerationResult result = runner.generate(prompt, options.sampling, print_token);
  if (!options.json) {
    fmt::print("{}\n", stream ? stream->finish() : "");
    return;
  }
  nlohmann::json top = nlohmann::json::array();
  for (const auto& entries : result.top_logprobs) top.push_back(top_logprobs_to_json(entries));
  nlohmann::json out = {
      {"prompt_ids", prompt},
      {"ids", result.ids},
      {"text", tokenizer ? tokenizer->decode(result.ids, /*skip_special_tokens=*/true) : ids_as_text(result.ids)},
      {"logprobs", result.logprobs},
      {"top_logprobs", top},
      {"finish_reason", result.finish_reason},
  };
  fmt::print("{}\n", out.dump());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "continue a prompt (greedy by default)");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  add_backend_flags(*command, options->backend.backend, options->backend.cuda_weights,
                    options->backend.state_dtype);
  CLI::Option* prompt = command->add_option("--prompt", options->prompt, "prompt text");
  CLI::Option* prompt_ids = command->add_option("--prompt-ids", options->prompt_ids, "prompt token ids, e.g. 1,2,3");
  prompt->excludes(prompt_ids);
  command->add_option("--max-tokens", options->sampling.max_tokens, "tokens to generate at most")->capture_default_str();
  command->add_option("--temperature", options->sampling.temperature, "0 is greedy")->capture_default_str();
  command->add_option("--top-k", options->sampling.top_k, "sample among the K most likely (0: all)");
  command->add_option("--top-p", options->sampling.top_p, "sample within probability mass P");
  command->add_option("--seed", options->sampling.seed, "seed for reproducible sampling")->check(CLI::NonNegativeNumber);
  command->add_option("--logprobs", options->sampling.num_top_logprobs, "top-K logprobs per generated token");
  command->add_flag("--json", options->json, "print one JSON object instead of streaming text");
  command->callback([options, prompt, prompt_ids] {
    if (prompt->count() == 0 && prompt_ids->count() == 0) throw UsageError("give --prompt or --prompt-ids");
    run_generate(*options);
  });
}

}  // namespace jambo::cli
