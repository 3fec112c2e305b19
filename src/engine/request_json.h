// JSON forms of requests and samples shared by `jambo batch` (and later the server and stress runs):
// a request line {"id", "prompt" | "prompt_ids", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p",
// "seed", "logprobs", "stop", "stop_token_ids"} and a sample line {"id", "sample", "prompt_ids", "ids",
// "text", "logprobs", "top_logprobs", "finish_reason"}.
#pragma once

#include "engine/engine.h"
#include "engine/request_spec.h"

#include <nlohmann/json.hpp>

#include <string_view>

namespace jambo::engine {

// Fields present in `line` override those of `defaults`. "prompt" needs a tokenizer. Throws jambo::Error naming the
// field that is unknown, missing or of the wrong type; ranges are the contract's (validate, request_spec.h), which
// the engine checks when the request is added.
RequestSpec request_from_json(const nlohmann::json& line, const RequestSpec& defaults,
                              const tokenizer::Tokenizer* tokenizer);

// The id of a request line: its "id" field (a string, or an integer as its decimal text), else default_id. Throws
// jambo::Error for an "id" of another type.
std::string request_id(const nlohmann::json& line, const std::string& default_id);

// A sample as a line of jambo batch's output, naming the backend that made it (engine::describe's words).
nlohmann::json sample_to_json(const SampleOutput& sample, std::string_view backend);

// [[id, logprob], ...]
nlohmann::json top_logprobs_to_json(const std::vector<backend::TokenLogprob>& entries);

// [{"version", "start", "end"}, ...]
nlohmann::json weight_versions_to_json(const std::vector<WeightVersionSpan>& spans);

}  // namespace jambo::engine
