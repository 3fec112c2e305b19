// jambo generate: continues one prompt as one request through the engine, the path every front end takes,
// streaming text as it is produced (or one JSON object with --json).
#include "cli/common.h"
#include "engine/backend_factory.h"
#include "engine/memory_budget.h"
#include "engine/request_json.h"
#include "engine/sequence_sampler.h"

#include <cstdio>
#include <sstream>

namespace jambo::cli {
namespace {

struct GenerateOptions {
  ModelOptions model;
  engine::BackendChoice backend;
  std::string prompt;
  std::string prompt_ids;
  engine::RequestSpec request;
  bool json = false;
  bool print_logprobs = false;  // --logprobs given without --json
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
std::string ids_as_text(std::span<const int32_t> ids) { return fmt::format("{}", fmt::join(ids, " ")); }

// An engine that holds exactly this one request: one state slot and the KV blocks of its tokens.
engine::EngineOptions single_request_engine(const model::Model& model, const engine::BackendChoice& choice,
                                            int64_t num_tokens) {
  engine::EngineOptions options;
  options.backend = choice;
  options.max_num_seqs = 1;
  options.max_model_len = num_tokens;
  const int64_t num_kv_blocks =
      model.config.num_attention_layers() > 0 ? backend::kv_blocks_for(num_tokens, options.kv_block_size) : 0;
  const engine::MemoryShare share = engine::memory_share(choice, model);
  options.memory_budget = {.bytes = engine::exact_memory_budget(share.config, share.weight_bytes, /*num_slots=*/1,
                                                                num_kv_blocks, options.kv_block_size,
                                                                choice.state_dtype)};
  return options;
}

// Streams what no stop string can cut any more: the text, or the ids when there is no tokenizer.
class TextPrinter {
 public:
  TextPrinter(bool has_tokenizer, const engine::RequestSpec& request) : has_tokenizer_(has_tokenizer) {
    for (const std::string& stop : request.stop.strings) max_stop_length_ = std::max(max_stop_length_, stop.size());
  }

  void on_progress(const engine::SampleProgress& progress) {
    if (!has_tokenizer_) {
      const std::span<const int32_t> ids(progress.output.ids);
      for (size_t i = num_printed_; i < ids.size(); ++i) fmt::print("{} ", ids[i]);
      num_printed_ = ids.size();
    } else {
      const size_t length =
          std::max(engine::stable_text_length(progress.text, progress.finished, max_stop_length_), num_printed_);
      fmt::print("{}", progress.text.substr(num_printed_, length - num_printed_));
      num_printed_ = length;
    }
    if (progress.finished) fmt::print("\n");
    std::fflush(stdout);
  }

 private:
  bool has_tokenizer_;
  size_t max_stop_length_ = 0;
  size_t num_printed_ = 0;  // bytes of text, or ids
};

// One line per generated token on stderr: position, id, logprob and the top-K alternatives.
void print_logprobs(const engine::SampleOutput& sample) {
  for (size_t i = 0; i < sample.ids.size(); ++i) {
    std::string top;
    for (const backend::TokenLogprob& entry : sample.top_logprobs[i])
      top += fmt::format(" {}:{:.6f}", entry.token, entry.logprob);
    fmt::print(stderr, "{}\t{}\t{:.6f}\t{}\n", i, sample.ids[i], sample.logprobs[i], top.empty() ? "" : top.substr(1));
  }
}

void run_generate(GenerateOptions& options) {
  const model::Model model = options.model.load(options.backend.kind);
  const std::optional<tokenizer::Tokenizer> tokenizer = options.model.load_tokenizer();
  engine::RequestSpec& request = options.request;
  request.id = "generate";
  if (!options.prompt_ids.empty()) {
    request.prompt_ids = parse_prompt_ids(options.prompt_ids);
  } else {
    JAMBO_REQUIRE(tokenizer, "--prompt needs {}/tokenizer.json; use --prompt-ids instead", options.model.folder);
    request.prompt_ids = tokenizer->encode(options.prompt);
  }
  const int64_t max_length = model.config.max_position_embeddings;
  const int64_t num_prompt = int64_t(request.prompt_ids.size());
  if (request.stop.max_tokens > max_length - num_prompt)
    throw UsageError(fmt::format("the prompt ({} tokens) plus --max-tokens {} exceeds the model's {} positions",
                                 num_prompt, request.stop.max_tokens, max_length));

  engine::Engine engine(model, tokenizer ? &*tokenizer : nullptr,
                        single_request_engine(model, options.backend, num_prompt + request.stop.max_tokens));
  TextPrinter printer(tokenizer.has_value(), request);
  if (!options.json)
    engine.set_progress_listener([&](const engine::SampleProgress& progress) { printer.on_progress(progress); });
  engine.add_request(request);
  std::vector<engine::SampleOutput> finished;
  while (engine.has_unfinished())
    for (engine::SampleOutput& sample : engine.step()) finished.push_back(std::move(sample));
  JAMBO_ASSERT(finished.size() == 1);
  const engine::SampleOutput& sample = finished[0];
  if (!options.json) {
    if (options.print_logprobs) print_logprobs(sample);
    return;
  }
  nlohmann::json top = nlohmann::json::array();
  for (const auto& entries : sample.top_logprobs) top.push_back(engine::top_logprobs_to_json(entries));
  nlohmann::json out = {
      {"prompt_ids", sample.prompt_ids},
      {"ids", sample.ids},
      {"text", tokenizer ? sample.text : ids_as_text(sample.ids)},
      {"logprobs", sample.logprobs},
      {"top_logprobs", top},
      {"finish_reason", sample.finish_reason},
  };
  fmt::print("{}\n", out.dump());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "continue a prompt (greedy by default)");
  options->model.add_to(*command, /*allow_random_weights=*/true);
  add_backend_flags(*command, options->backend);
  CLI::Option* prompt = command->add_option("--prompt", options->prompt, "prompt text");
  CLI::Option* prompt_ids = command->add_option("--prompt-ids", options->prompt_ids, "prompt token ids, e.g. 1,2,3");
  prompt->excludes(prompt_ids);
  add_request_flags(*command, options->request);
  CLI::Option* logprobs =
      command->add_option("--logprobs", options->request.num_top_logprobs,
                          "top-K logprobs per generated token: in the JSON object with --json, else a line per token "
                          "on stderr (position, id, logprob, top-K as id:logprob)");
  command->add_flag("--json", options->json, "print one JSON object instead of streaming text");
  command->callback([options, prompt, prompt_ids, logprobs] {
    if (prompt->count() == 0 && prompt_ids->count() == 0) throw UsageError("give --prompt or --prompt-ids");
    options->print_logprobs = logprobs->count() > 0 && !options->json;
    validate_request_flags(options->request);
    run_generate(*options);
  });
}

}  // namespace jambo::cli
