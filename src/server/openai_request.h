// Reads the bodies of POST /v1/completions and /v1/chat/completions into engine request options,
// field by field as OpenAI documents them. Anything wrong (type, range, a field OpenAI would reject,
// a prompt longer than the context) is an ApiError naming the field, before the engine sees it.
#pragma once

#include "core/error.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace jambo::chat_template {
class ChatTemplate;
}

namespace jambo::server {

// An error the client gets as an OpenAI error object: {"error": {"message", "type", "param", "code"}}.
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error");
  int status;
  std::string param;  // the offending field ("" when none)
  std::string type;
};

// What requests may ask for on this server.
struct ServerLimits {
  std::string model_name;     // the one model served; requests must name it
  int64_t max_model_len = 0;  // prompt plus generated tokens
  int64_t max_n = 1;          // samples per prompt
  int64_t max_num_prompts = 1;
  int64_t vocab_size = 0;
};

struct GenerationRequest {
  bool chat = false;
  std::vector<std::vector<int32_t>> prompts;  // [num_prompts][tokens]
  engine::RequestSpec options;                // all but id and prompt_ids
  bool stream = false;
  bool include_usage = false;
  bool echo = false;          // completions: the prompt is part of each choice's text
  int64_t num_logprobs = -1;  // -1: no logprobs; else top-K per token (completions logprobs, chat top_logprobs)
  bool return_token_ids = false;  // the prompt's and each choice's token ids beside the text (vLLM's field)
};

GenerationRequest parse_completion_request(const nlohmann::json& body, const ServerLimits& limits,
                                           const tokenizer::Tokenizer& tokenizer);
GenerationRequest parse_chat_request(const nlohmann::json& body, const ServerLimits& limits,
                                     const tokenizer::Tokenizer& tokenizer,
                                     const chat_template::ChatTemplate& chat_template);

// POST /tokenize: {"prompt", "add_special_tokens"} or {"messages", "add_generation_prompt"}; the token ids.
std::vector<int32_t> parse_tokenize_request(const nlohmann::json& body, const ServerLimits& limits,
                                            const tokenizer::Tokenizer& tokenizer,
                                            const chat_template::ChatTemplate* chat_template);
// POST /detokenize: {"tokens"}; the token ids, each checked against the vocabulary.
std::vector<int32_t> parse_detokenize_request(const nlohmann::json& body, const ServerLimits& limits);

// Parses a request body; a body that is not a JSON object is an ApiError.
nlohmann::json parse_body(const std::string& body);

}  // namespace jambo::server
