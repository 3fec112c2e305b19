#include "server/openai_response.h"

#include "engine/request_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

namespace jambo::server {

using nlohmann::json;

std::string to_wire(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error",
           {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)}, {"code", nullptr}}}};
}

ApiError api_error_for(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ApiError& api_error) {
    return api_error;
  } catch (const Error& bad_input) {
    return ApiError(400, bad_input.what());
  } catch (const InternalError& bug) {
    return ApiError(500, bug.what(), "", "server_error");  // it says "internal error" and where
  } catch (const std::exception& exception) {
    return ApiError(500, fmt::format("internal error: {}", exception.what()), "", "server_error");
  } catch (...) {
    return ApiError(500, "internal error", "", "server_error");
  }
}

namespace {

// Characters as OpenAI counts them (code points), not UTF-8 bytes.
int64_t count_characters(const std::string& text) {
  return std::count_if(text.begin(), text.end(),
                       [](char byte) { return (static_cast<unsigned char>(byte) & 0xC0) != 0x80; });
}

// A token that ends inside a character, as OpenAI names it: "bytes:\xe2\x80".
std::string byte_token_name(const std::string& bytes) {
  std::string name = "bytes:";
  for (unsigned char byte : bytes) name += fmt::format("\\x{:02x}", byte);
  return name;
}

json bytes_of(const std::string& text) {
  json bytes = json::array();
  for (unsigned char byte : text) bytes.push_back(int(byte));
  return bytes;
}

// Append-only views of the completions logprobs arrays.
json empty_completion_logprobs() {
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

void append_all(json& into, const json& from) {
  for (const auto& [key, values] : from.items())
    for (const json& value : values) into[key].push_back(value);
}

}  // namespace

ResponseBuilder::ResponseBuilder(const GenerationRequest& request, std::string id, std::string model, int64_t created,
                                 const tokenizer::Tokenizer& tokenizer)
    : request_(request),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      tokenizer_(tokenizer),
      choices_(request.prompts.size() * size_t(request.options.n)) {
  for (Choice& choice : choices_)
    choice.logprobs = request.chat ? json{{"content", json::array()}} : empty_completion_logprobs();
}

// A token as it reads inside a text: SentencePiece marks a leading space with U+2581, which decoding a
// token alone would strip.
std::string ResponseBuilder::token_text(int32_t id) const {
  const int32_t ids[] = {id};
  std::string text = tokenizer_.decode(ids);
  const std::optional<std::string> piece = tokenizer_.id_to_token(id);
  if (piece && piece->starts_with("\u2581") && !text.starts_with(" ")) return " " + text;
  return text;
}

// Decoding the tokens one by one as the engine does (special tokens skipped) makes the pieces add up to
// the choice's text exactly; a byte token that ends inside a character adds nothing until the character
// is complete, and is shown by its bytes.
// The bytes a token stands for: SentencePiece's byte-fallback tokens are named "<0xNN>".
std::string ResponseBuilder::token_bytes(int32_t id) const {
  const std::optional<std::string> piece = tokenizer_.id_to_token(id);
  unsigned byte = 0;
  if (piece && piece->size() == 6 && std::sscanf(piece->c_str(), "<0x%2X>", &byte) == 1)
    return std::string(1, char(byte));
  return token_text(id);
}

ResponseBuilder::Piece ResponseBuilder::next_piece(tokenizer::IncrementalDecoder& decoder, int32_t id) const {
  std::string text = decoder.push(id);
  if (tokenizer_.is_special(id)) return {tokenizer_.id_to_token(id).value_or(""), std::move(text)};
  if (text.empty()) return {byte_token_name(token_bytes(id)), ""};
  return {text, text};
}

json ResponseBuilder::completion_logprobs(Choice& choice, tokenizer::IncrementalDecoder& decoder,
                                          const std::vector<int32_t>& ids,
                                          const std::vector<std::optional<double>>& logprobs,
                                          const std::vector<std::vector<backend::TokenLogprob>>& top) const {
  json result = empty_completion_logprobs();
  for (size_t i = 0; i < ids.size(); ++i) {
    const Piece piece = next_piece(decoder, ids[i]);
    result["tokens"].push_back(piece.token);
    result["token_logprobs"].push_back(logprobs[i] ? json(*logprobs[i]) : json());
    if (!logprobs[i]) {
      result["top_logprobs"].push_back(nullptr);
    } else {
      json entries = json::object();
      for (const backend::TokenLogprob& entry : top[i]) entries[token_text(entry.token)] = entry.logprob;
      result["top_logprobs"].push_back(std::move(entries));
    }
    result["text_offset"].push_back(choice.text_offset);
    choice.text_offset += count_characters(piece.text);
  }
  return result;
}

json ResponseBuilder::chat_logprobs(Choice& choice, const StreamEvent& event) const {
  json content = json::array();
  for (size_t i = 0; i < event.ids.size(); ++i) {
    const std::string text = next_piece(*choice.decoder, event.ids[i]).token;
    json top = json::array();
    for (const backend::TokenLogprob& entry : event.top_logprobs[i])
      top.push_back({{"token", token_text(entry.token)},
                     {"logprob", entry.logprob},
                     {"bytes", bytes_of(token_bytes(entry.token))}});
    content.push_back({{"token", text},
                       {"logprob", event.logprobs[i]},
                       {"bytes", bytes_of(token_bytes(event.ids[i]))},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// vLLM's form: per prompt token, null for the first, else {id: {logprob, decoded_token}} for the
// token itself and the top-K.
json ResponseBuilder::prompt_logprobs(const engine::SampleOutput& prompt) const {
  json result = json::array();
  for (size_t i = 0; i < prompt.prompt_ids.size(); ++i) {
    if (!prompt.prompt_logprobs[i]) {
      result.push_back(nullptr);
      continue;
    }
    json entries = json::object();
    const int32_t token = prompt.prompt_ids[i];
    entries[std::to_string(token)] = {{"logprob", *prompt.prompt_logprobs[i]}, {"decoded_token", token_text(token)}};
    for (const backend::TokenLogprob& entry : prompt.prompt_top_logprobs[i])
      entries[std::to_string(entry.token)] = {{"logprob", entry.logprob}, {"decoded_token", token_text(entry.token)}};
    result.push_back(std::move(entries));
  }
  return result;
}

json ResponseBuilder::add(const StreamEvent& event) {
  Choice& choice = choices_.at(size_t(event.choice));
  if (!choice.decoder) choice.decoder.emplace(tokenizer_, /*skip_special_tokens=*/true);
  std::string text = event.text;
  json logprobs;
  if (request_.chat) {
    if (request_.num_logprobs >= 0) {
      logprobs = chat_logprobs(choice, event);
      append_all(choice.logprobs, logprobs);
    }
  } else {
    logprobs = empty_completion_logprobs();
    const bool has_prompt_logprobs = event.prompt && !event.prompt->prompt_logprobs.empty();
    if (event.prompt && request_.echo) {
      // The prompt as its tokens decode, so that text_offset indexes the text returned.
      text = tokenizer_.decode(event.prompt->prompt_ids, /*skip_special_tokens=*/true) + text;
      if (request_.num_logprobs >= 0 && has_prompt_logprobs) {
        tokenizer::IncrementalDecoder prompt_decoder(tokenizer_, /*skip_special_tokens=*/true);
        append_all(logprobs, completion_logprobs(choice, prompt_decoder, event.prompt->prompt_ids,
                                                 event.prompt->prompt_logprobs, event.prompt->prompt_top_logprobs));
      }
    }
    if (has_prompt_logprobs && request_.options.num_prompt_logprobs)
      choice.prompt_logprobs = prompt_logprobs(*event.prompt);
    if (request_.num_logprobs >= 0) {
      const std::vector<std::optional<double>> sampled(event.logprobs.begin(), event.logprobs.end());
      append_all(logprobs, completion_logprobs(choice, *choice.decoder, event.ids, sampled, event.top_logprobs));
      append_all(choice.logprobs, logprobs);
    }
  }
  choice.text += text;
  if (event.prompt && request_.return_token_ids) choice.prompt_ids = event.prompt->prompt_ids;
  choice.ids.insert(choice.ids.end(), event.ids.begin(), event.ids.end());
  choice.finish_reason = event.finish_reason;
  if (!event.finish_reason.empty()) {
    choice.weight_versions = event.weight_versions;
    if (request_.options.return_routed_experts)
      choice.routed_experts = {{"prompt_routed_experts", event.prompt_routed_experts},
                               {"routed_experts", event.routed_experts}};
  }

  const json finish = event.finish_reason.empty() ? json() : json(event.finish_reason);
  const json chunk_logprobs = request_.num_logprobs >= 0 ? logprobs : json();
  json chunk_choice;
  if (request_.chat) {
    json delta = json::object();
    if (event.prompt) delta["role"] = "assistant";
    if (!text.empty() || event.prompt) delta["content"] = text;
    chunk_choice = {{"index", event.choice}, {"delta", delta}, {"logprobs", chunk_logprobs}, {"finish_reason", finish}};
  } else {
    chunk_choice = {{"index", event.choice}, {"text", text}, {"logprobs", chunk_logprobs}, {"finish_reason", finish}};
    if (event.prompt && !choice.prompt_logprobs.is_null()) chunk_choice["prompt_logprobs"] = choice.prompt_logprobs;
  }
  if (!event.finish_reason.empty()) chunk_choice["weight_versions"] = engine::weight_versions_to_json(event.weight_versions);
  if (choice.routed_experts.is_object()) chunk_choice.update(choice.routed_experts);
  // Token ids as vLLM returns them: the choice's new ids in each chunk, the prompt's with the choice's first chunk
  // (a chat's one prompt at the chunk's top level, a completion's in the choice).
  if (request_.return_token_ids) {
    chunk_choice["token_ids"] = event.ids;
    if (event.prompt && !request_.chat) chunk_choice["prompt_token_ids"] = event.prompt->prompt_ids;
  }
  json chunk = envelope(json::array({chunk_choice}));
  if (request_.return_token_ids && event.prompt && request_.chat) chunk["prompt_token_ids"] = event.prompt->prompt_ids;
  chunk["object"] = request_.chat ? "chat.completion.chunk" : "text_completion";
  if (request_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json ResponseBuilder::response() const {
  json choices = json::array();
  for (size_t c = 0; c < choices_.size(); ++c) {
    const Choice& choice = choices_[c];
    const json logprobs = request_.num_logprobs >= 0 ? choice.logprobs : json();
    json entry;
    if (request_.chat) {
      entry = {{"index", c},
               {"message", {{"role", "assistant"}, {"content", choice.text}}},
               {"logprobs", logprobs},
               {"finish_reason", choice.finish_reason}};
    } else {
      entry = {{"index", c}, {"text", choice.text}, {"logprobs", logprobs}, {"finish_reason", choice.finish_reason}};
      if (!choice.prompt_logprobs.is_null()) entry["prompt_logprobs"] = choice.prompt_logprobs;
      if (request_.return_token_ids) entry["prompt_token_ids"] = choice.prompt_ids;
    }
    if (request_.return_token_ids) entry["token_ids"] = choice.ids;
    entry["weight_versions"] = engine::weight_versions_to_json(choice.weight_versions);
    if (choice.routed_experts.is_object()) entry.update(choice.routed_experts);
    choices.push_back(std::move(entry));
  }
  json body = envelope(std::move(choices));
  if (request_.return_token_ids && request_.chat) body["prompt_token_ids"] = request_.prompts.front();
  body["object"] = request_.chat ? "chat.completion" : "text_completion";
  body["usage"] = usage();
  return body;
}

json ResponseBuilder::usage_chunk() const {
  json chunk = envelope(json::array());
  chunk["object"] = request_.chat ? "chat.completion.chunk" : "text_completion";
  chunk["usage"] = usage();
  return chunk;
}

int64_t ResponseBuilder::num_prompt_tokens() const {
  int64_t total = 0;
  for (const auto& prompt : request_.prompts) total += int64_t(prompt.size());
  return total;
}

int64_t ResponseBuilder::num_completion_tokens() const {
  int64_t total = 0;
  for (const Choice& choice : choices_) total += int64_t(choice.ids.size());
  return total;
}

json ResponseBuilder::envelope(json choices) const {
  return {{"id", id_}, {"created", created_}, {"model", model_}, {"choices", std::move(choices)}};
}

json ResponseBuilder::usage() const {
  const int64_t prompt_tokens = num_prompt_tokens();
  const int64_t completion_tokens = num_completion_tokens();
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace jambo::server
