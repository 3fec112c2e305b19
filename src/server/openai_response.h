// Builds OpenAI-format responses from a request's stream events: the whole response (non-streaming)
// and the server-sent-event chunks (streaming), for completions and chat completions alike.
#pragma once

#include "tokenizer/tokenizer.h"
#include "server/openai_request.h"
#include "server/request_stream.h"

#include <nlohmann/json.hpp>

#include <exception>
#include <string>
#include <vector>

namespace jambo::server {

// Serializes for the wire; bytes that are not UTF-8 (a lone byte token) become U+FFFD instead of throwing.
std::string to_wire(const nlohmann::json& value);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param);

// The answer to an exception thrown while answering a request: an ApiError as it is, other bad input (jambo::Error)
// 400, and anything else (jambo::InternalError, a library's exception) a bug in jambo: 500 of type "server_error",
// the type of OpenAI's own 500s and of every 5xx here.
ApiError api_error_for(std::exception_ptr error);

class ResponseBuilder {
 public:
  ResponseBuilder(const GenerationRequest& request, std::string id, std::string model, int64_t created,
                  const tokenizer::Tokenizer& tokenizer);

  // Takes one event; returns the stream chunk that tells it.
  nlohmann::json add(const StreamEvent& event);
  nlohmann::json response() const;     // the whole response, once every choice finished
  nlohmann::json usage_chunk() const;  // stream_options.include_usage: the last chunk, no choices
  int64_t num_prompt_tokens() const;   // every prompt once, whatever n
  int64_t num_completion_tokens() const;

 private:
  struct Choice {
    std::optional<tokenizer::IncrementalDecoder> decoder;  // over the generated tokens, as the engine decodes them
    std::string text;
    std::string finish_reason;
    nlohmann::json logprobs;  // completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat: {content}
    int64_t text_offset = 0;         // completions: where the next token's text starts
    nlohmann::json prompt_logprobs;  // completions with prompt_logprobs: [null, {id: {logprob, decoded_token}}, ...]
    std::vector<int32_t> ids;         // the generated tokens
    std::vector<int32_t> prompt_ids;  // with return_token_ids: the choice's prompt
    std::vector<engine::WeightVersionSpan> weight_versions;  // once finished
    // Once finished, with return_routed_experts: {prompt_routed_experts, routed_experts}.
    nlohmann::json routed_experts;
  };

  // A token as the logprobs show it and the text it adds to the choice's text.
  struct Piece {
    std::string token;  // a special token by name (it adds no text), else its text
    std::string text;
  };
  std::string token_text(int32_t id) const;
  std::string token_bytes(int32_t id) const;
  Piece next_piece(tokenizer::IncrementalDecoder& decoder, int32_t id) const;
  nlohmann::json completion_logprobs(Choice& choice, tokenizer::IncrementalDecoder& decoder,
                                     const std::vector<int32_t>& ids,
                                     const std::vector<std::optional<double>>& logprobs,
                                     const std::vector<std::vector<backend::TokenLogprob>>& top) const;
  nlohmann::json chat_logprobs(Choice& choice, const StreamEvent& event) const;
  nlohmann::json prompt_logprobs(const engine::SampleOutput& prompt) const;
  nlohmann::json envelope(nlohmann::json choices) const;
  nlohmann::json usage() const;

  const GenerationRequest& request_;
  std::string id_;
  std::string model_;
  int64_t created_;
  const tokenizer::Tokenizer& tokenizer_;
  std::vector<Choice> choices_;
};

}  // namespace jambo::server
