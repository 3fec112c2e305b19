// jambo tokenize / detokenize: text on stdin to JSON ids on stdout, and back. Only tokenizer.json is needed.
#include "cli/common.h"
#include "model/safetensors.h"

#include <iostream>
#include <iterator>

namespace jambo::cli {
namespace {

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

tokenizer::Tokenizer load_tokenizer(const std::string& folder) {
  model::require_model_folder(folder);
  return tokenizer::Tokenizer::load(folder);
}

void run_tokenize(const std::string& folder, bool no_special) {
  const tokenizer::Tokenizer tokenizer = load_tokenizer(folder);
  fmt::print("{}\n", nlohmann::json(tokenizer.encode(read_stdin(), !no_special)).dump());
}

void run_detokenize(const std::string& folder, bool skip_special) {
  const tokenizer::Tokenizer tokenizer = load_tokenizer(folder);
  nlohmann::json ids;
  try {
    ids = parse_json(read_stdin());
  } catch (const Error& error) {
    fail("stdin: {}", error.what());
  }
  JAMBO_REQUIRE(ids.is_array(), "stdin: expected a JSON array of token ids, got {}", describe_json(ids));
  std::vector<int32_t> tokens;
  for (const nlohmann::json& id : ids) {
    JAMBO_REQUIRE(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < tokenizer.vocab_size(),
                  "stdin: {} is not a token id of this tokenizer (vocabulary size {})", describe_json(id),
                  tokenizer.vocab_size());
    tokens.push_back(id.get<int32_t>());
  }
  fmt::print("{}", tokenizer.decode(tokens, skip_special));
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  struct Options {
    std::string folder;
    bool no_special = false;
    bool skip_special = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* tokenize = app.add_subcommand("tokenize", "text on stdin -> JSON token ids on stdout");
  tokenize->add_option("--model", options->folder, "folder with tokenizer.json")->required();
  tokenize->add_flag("--no-special", options->no_special, "do not add BOS/EOS (the post-processor)");
  tokenize->callback([options] { run_tokenize(options->folder, options->no_special); });

  CLI::App* detokenize = app.add_subcommand("detokenize", "JSON token ids on stdin -> text on stdout");
  detokenize->add_option("--model", options->folder, "folder with tokenizer.json")->required();
  detokenize->add_flag("--skip-special", options->skip_special, "leave special tokens out of the text");
  detokenize->callback([options] { run_detokenize(options->folder, options->skip_special); });
}

}  // namespace jambo::cli
