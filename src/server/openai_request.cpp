#include "server/openai_request.h"

#include "core/json.h"
#include "chat_template/chat_template.h"
#include "engine/request_spec.h"

#include <fmt/format.h>

#include <limits>
#include <map>
#include <set>

namespace jambo::server {

using nlohmann::json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type)
    : Error(message), status(status), param(std::move(param)), type(std::move(type)) {}

namespace {

constexpr double kMaxTemperature = 2.0;  // OpenAI's range, stricter than the engine's contract

[[noreturn]] void bad_field(const std::string& field, const std::string& message) {
  throw ApiError(400, fmt::format("'{}': {}", field, message), field);
}

// Reads the fields of one request body; a field it never reads is unrecognized, as OpenAI rejects it.
class Fields {
 public:
  Fields(const json& body, std::set<std::string> known) : body_(body), known_(std::move(known)) {
    for (const auto& [name, value] : body_.items())
      if (!known_.contains(name))
        throw ApiError(400, fmt::format("Unrecognized request argument supplied: {}", name), name);
  }

  // The field, or nullptr when it is absent or null (OpenAI treats null as "not given").
  const json* find(const std::string& name) const {
    const auto found = body_.find(name);
    return found == body_.end() || found->is_null() ? nullptr : &*found;
  }

  // Numbers of any value: the ranges are the request contract's (validate, engine/request_spec.h), checked once.
  int64_t integer(const std::string& name, int64_t fallback) const {
    return integer(name, fallback, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  }
  double number(const std::string& name, double fallback) const {
    return number(name, fallback, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity());
  }

  int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
    const json* value = find(name);
    if (!value) return fallback;
    if (!value->is_number_integer()) bad_field(name, fmt::format("must be an integer, got {}", describe_json(*value)));
    if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad_field(name, fmt::format("must be between {} and {}, got {}", min, max, value->dump()));
    const int64_t number = value->get<int64_t>();
    if (number < min || number > max)
      bad_field(name, fmt::format("must be between {} and {}, got {}", min, max, number));
    return number;
  }

  double number(const std::string& name, double fallback, double min, double max) const {
    const json* value = find(name);
    if (!value) return fallback;
    if (!value->is_number()) bad_field(name, fmt::format("must be a number, got {}", describe_json(*value)));
    const double number = value->get<double>();
    if (!(number >= min && number <= max))
      bad_field(name, fmt::format("must be between {} and {}, got {}", min, max, number));
    return number;
  }

  bool boolean(const std::string& name, bool fallback) const {
    const json* value = find(name);
    if (!value) return fallback;
    if (!value->is_boolean()) bad_field(name, fmt::format("must be true or false, got {}", describe_json(*value)));
    return value->get<bool>();
  }

  std::string string(const std::string& name) const {
    const json* value = find(name);
    if (!value) return "";
    if (!value->is_string()) bad_field(name, fmt::format("must be a string, got {}", describe_json(*value)));
    return value->get<std::string>();
  }

 private:
  const json& body_;
  std::set<std::string> known_;
};

const std::set<std::string> kSharedFields = {"model",
                                             "max_tokens",
                                             "temperature",
                                             "top_p",
                                             "top_k",
                                             "min_p",
                                             "n",
                                             "seed",
                                             "stop",
                                             "stop_token_ids",
                                             "stream",
                                             "stream_options",
                                             "user",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "logit_bias",
                                             "ignore_eos",
                                             "return_token_ids",
                                             "return_routed_experts"};

std::set<std::string> with_shared(std::set<std::string> fields) {
  fields.insert(kSharedFields.begin(), kSharedFields.end());
  return fields;
}

void check_model(const Fields& fields, const ServerLimits& limits) {
  const json* model = fields.find("model");
  if (!model) bad_field("model", "is required");
  if (!model->is_string()) bad_field("model", fmt::format("must be a string, got {}", describe_json(*model)));
  if (model->get<std::string>() != limits.model_name)
    throw ApiError(404,
                   fmt::format("The model '{}' does not exist; this server serves '{}'", model->get<std::string>(),
                               limits.model_name),
                   "model", "model_not_found");
}

// Options jambo does not implement are accepted only at the value that means "off", never ignored.
void check_unsupported(const Fields& fields) {
  for (const char* penalty : {"presence_penalty", "frequency_penalty"})
    if (fields.number(penalty, 0.0, -2.0, 2.0) != 0.0) bad_field(penalty, "is not supported by jambo; only 0 is");
  if (const json* bias = fields.find("logit_bias"); bias && !(bias->is_object() && bias->empty()))
    bad_field("logit_bias", "is not supported by jambo; give null or {}");
  fields.string("user");
}

std::vector<std::string> stop_strings(const Fields& fields) {
  const json* value = fields.find("stop");
  if (!value) return {};
  if (value->is_string()) return {value->get<std::string>()};
  if (!value->is_array())
    bad_field("stop", fmt::format("must be a string or an array of strings, got {}", describe_json(*value)));
  std::vector<std::string> stops;
  for (const json& stop : *value) {
    if (!stop.is_string()) bad_field("stop", fmt::format("holds {}, which is not a string", describe_json(stop)));
    stops.push_back(stop.get<std::string>());
  }
  return stops;
}

// Token ids as JSON integers of int32's range; the vocabulary is the caller's to check.
std::vector<int32_t> token_ids(const json& value, const std::string& field) {
  std::vector<int32_t> ids;
  for (const json& id : value) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      bad_field(field, fmt::format("holds {}, which is not a token id", describe_json(id)));
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// The options every generation request shares; max_tokens is checked later, against each prompt.
engine::RequestSpec shared_options(const Fields& fields, const ServerLimits& limits) {
  check_model(fields, limits);
  check_unsupported(fields);
  engine::RequestSpec spec;
  spec.sampling.temperature = fields.number("temperature", 1.0);
  if (spec.sampling.temperature > kMaxTemperature)
    bad_field("temperature", fmt::format("must be at most {}, got {}", kMaxTemperature, spec.sampling.temperature));
  spec.sampling.top_p = fields.number("top_p", 1.0);
  const int64_t top_k = fields.integer("top_k", 0);
  spec.sampling.top_k = top_k == -1 ? 0 : top_k;  // -1 and 0 both mean no limit
  spec.sampling.min_p = fields.number("min_p", 0.0);
  spec.n = fields.integer("n", 1);
  if (fields.find("seed")) spec.sampling.seed = uint64_t(fields.integer("seed", 0));
  spec.stop.strings = stop_strings(fields);
  if (const json* ids = fields.find("stop_token_ids")) {
    if (!ids->is_array()) bad_field("stop_token_ids", "must be an array of token ids");
    spec.stop.token_ids = token_ids(*ids, "stop_token_ids");
  }
  spec.stop.ignore_eos = fields.boolean("ignore_eos", false);
  spec.return_routed_experts = fields.boolean("return_routed_experts", false);
  return spec;
}

void read_streaming(const Fields& fields, GenerationRequest& request) {
  request.stream = fields.boolean("stream", false);
  const json* options = fields.find("stream_options");
  if (!options) return;
  if (!request.stream) bad_field("stream_options", "is only allowed when 'stream' is true");
  if (!options->is_object()) bad_field("stream_options", "must be an object");
  for (const auto& [name, value] : options->items()) {
    if (name != "include_usage") bad_field("stream_options." + name, "is not a known stream option");
    if (!value.is_boolean()) bad_field("stream_options.include_usage", "must be true or false");
    request.include_usage = value.get<bool>();
  }
}

// max_tokens: given, or (chat) whatever the context leaves; the longest prompt must leave room for it.
// The tokens the context leaves after the longest prompt; none left is an error naming the prompt's field.
int64_t context_room(const std::vector<std::vector<int32_t>>& prompts, const ServerLimits& limits,
                     const std::string& prompt_field) {
  size_t longest = 0;
  for (const auto& prompt : prompts) longest = std::max(longest, prompt.size());
  const int64_t room = limits.max_model_len - int64_t(longest);
  if (room < 1)
    bad_field(prompt_field, fmt::format("the prompt is {} tokens; this server's context (max_model_len) is {} tokens",
                                        longest, limits.max_model_len));
  return room;
}

void check_lengths(const Fields& fields, GenerationRequest& request, const ServerLimits& limits,
                   const std::string& max_tokens_field, std::optional<int64_t> default_max_tokens) {
  const int64_t room = context_room(request.prompts, limits, request.chat ? "messages" : "prompt");
  request.options.stop.max_tokens = fields.integer(max_tokens_field, default_max_tokens.value_or(room));
}

void read_prompts(const json& prompt, const ServerLimits& limits, const tokenizer::Tokenizer& tokenizer,
                  GenerationRequest& request) {
  auto add_text = [&](const std::string& text) { request.prompts.push_back(tokenizer.encode(text)); };
  auto add_ids = [&](const json& ids) {
    if (ids.empty()) bad_field("prompt", "a prompt of token ids is empty");
    request.prompts.push_back(token_ids(ids, "prompt"));
  };
  if (prompt.is_string()) {
    add_text(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    add_ids(prompt);
  } else if (prompt.is_array() && !prompt.empty()) {
    if (prompt.size() > size_t(limits.max_num_prompts))
      bad_field("prompt", fmt::format("holds {} prompts; at most {}", prompt.size(), limits.max_num_prompts));
    for (const json& item : prompt) {
      if (item.is_string())
        add_text(item.get<std::string>());
      else if (item.is_array())
        add_ids(item);
      else
        bad_field("prompt", fmt::format("holds {}; give strings or arrays of token ids", describe_json(item)));
    }
  } else {
    bad_field("prompt", fmt::format("must be a string, an array of strings, an array of token ids or an array of "
                                    "such arrays (non-empty), got {}",
                                    describe_json(prompt)));
  }
  for (const auto& ids : request.prompts)
    if (ids.empty()) bad_field("prompt", "a prompt encodes to no tokens");
  // An n outside [1, max_n] is the contract's to refuse (check_contract); inside it the product cannot overflow.
  const bool n_in_range = request.options.n >= 1 && request.options.n <= limits.max_n;
  if (n_in_range && int64_t(request.prompts.size()) * request.options.n > limits.max_n)
    bad_field("n",
              fmt::format("{} prompts of n = {} make {} samples; this server holds {} at once", request.prompts.size(),
                          request.options.n, int64_t(request.prompts.size()) * request.options.n, limits.max_n));
}

// Every prompt's request against the one contract, the field named as this endpoint spells it (`renamed`: the
// contract's name -> the endpoint's).
void check_contract(const GenerationRequest& request, const ServerLimits& limits,
                    const std::map<std::string, std::string>& renamed) {
  const engine::RequestLimits contract{limits.vocab_size, limits.max_model_len, limits.max_n, /*has_tokenizer=*/true};
  for (const std::vector<int32_t>& prompt : request.prompts) {
    engine::RequestSpec spec = request.options;
    spec.prompt_ids = prompt;
    if (const std::optional<engine::FieldError> error = validate(spec, contract)) {
      const auto rename = renamed.find(error->field);
      bad_field(rename == renamed.end() ? error->field : rename->second, error->message);
    }
  }
}

// A member that must be a string, or bad_field naming it as `field`.
const std::string& string_member(const json& object, const char* name, const std::string& field) {
  const auto found = object.find(name);
  if (found == object.end()) bad_field(field, "is required");
  if (!found->is_string()) bad_field(field, fmt::format("must be a string, got {}", describe_json(*found)));
  return found->get_ref<const std::string&>();
}

// One part of an array content: {"type": "text", "text": "..."}, the only kind a text model reads.
const std::string& text_part(const json& part, const std::string& field) {
  if (!part.is_object()) bad_field(field, fmt::format("must be an object, got {}", describe_json(part)));
  const std::string& type = string_member(part, "type", field + ".type");
  if (type != "text")
    bad_field(field + ".type", fmt::format("is \"{}\"; only text parts are supported", type));
  return string_member(part, "text", field + ".text");
}

std::string message_content(const json& message, size_t index) {
  const std::string field = fmt::format("messages[{}].content", index);
  const auto content = message.find("content");
  if (content == message.end() || content->is_null()) return "";
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) bad_field(field, "must be a string or an array of text parts");
  std::string text;
  for (size_t k = 0; k < content->size(); ++k) text += text_part((*content)[k], fmt::format("{}[{}]", field, k));
  return text;
}

void check_response_format(const json& format) {
  if (!format.is_object()) bad_field("response_format", fmt::format("must be an object, got {}", describe_json(format)));
  if (string_member(format, "type", "response_format.type") != "text")
    bad_field("response_format", "only {\"type\": \"text\"} is supported by jambo");
}

// Messages checked and normalized (content as a string) for the template.
json chat_messages(const Fields& fields) {
  const json* messages = fields.find("messages");
  if (!messages) bad_field("messages", "is required");
  if (!messages->is_array() || messages->empty()) bad_field("messages", "must be a non-empty array of messages");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  json normalized = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string field = fmt::format("messages[{}]", i);
    if (!message.is_object()) bad_field(field, fmt::format("must be an object, got {}", describe_json(message)));
    const auto role = message.find("role");
    if (role == message.end() || !role->is_string() || !roles.contains(role->get<std::string>()))
      bad_field(field + ".role", "must be one of system, developer, user, assistant, tool");
    for (const auto& [name, value] : message.items())
      if (name != "role" && name != "content" && name != "name")
        bad_field(fmt::format("{}.{}", field, name), "is not supported by jambo");
    json entry = {{"role", role->get<std::string>()}, {"content", message_content(message, i)}};
    if (message.contains("name")) {
      if (!message["name"].is_string()) bad_field(field + ".name", "must be a string");
      entry["name"] = message["name"];
    }
    normalized.push_back(std::move(entry));
  }
  return normalized;
}

// The messages rendered by the chat template and tokenized as transformers does: no special tokens added,
// since the template writes them.
std::vector<int32_t> chat_prompt(const Fields& fields, const tokenizer::Tokenizer& tokenizer,
                                 const chat_template::ChatTemplate& chat_template) {
  const json messages = chat_messages(fields);
  std::string text;
  try {
    text = chat_template.render(messages, fields.boolean("add_generation_prompt", true));
  } catch (const Error& error) {
    bad_field("messages", error.what());
  }
  std::vector<int32_t> ids = tokenizer.encode(text, /*add_special_tokens=*/false);
  if (ids.empty()) bad_field("messages", "the chat template rendered no tokens");
  return ids;
}

}  // namespace

json parse_body(const std::string& body) {
  json parsed;
  try {
    parsed = parse_json(body);
  } catch (const JsonTooDeep& error) {
    throw ApiError(400, fmt::format("We could not parse the JSON body of your request: {}", error.what()), error.field);
  } catch (const Error& error) {
    throw ApiError(400, fmt::format("We could not parse the JSON body of your request: {}", error.what()));
  }
  if (!parsed.is_object()) throw ApiError(400, "The request body must be a JSON object");
  return parsed;
}

GenerationRequest parse_completion_request(const json& body, const ServerLimits& limits,
                                           const tokenizer::Tokenizer& tokenizer) {
  const Fields fields(body, with_shared({"prompt", "logprobs", "echo", "prompt_logprobs", "suffix", "best_of"}));
  GenerationRequest request;
  request.options = shared_options(fields, limits);
  read_streaming(fields, request);
  request.return_token_ids = fields.boolean("return_token_ids", false);
  if (fields.find("suffix")) bad_field("suffix", "is not supported by jambo");
  if (fields.integer("best_of", request.options.n) != request.options.n)
    bad_field("best_of", "is supported only equal to n");
  const json* prompt = fields.find("prompt");
  if (!prompt) bad_field("prompt", "is required");
  read_prompts(*prompt, limits, tokenizer, request);
  check_lengths(fields, request, limits, "max_tokens", 16);
  request.echo = fields.boolean("echo", false);
  if (fields.find("logprobs")) {
    request.num_logprobs = fields.integer("logprobs", 0);
    request.options.num_top_logprobs = request.num_logprobs;
  }
  if (fields.find("prompt_logprobs")) request.options.num_prompt_logprobs = fields.integer("prompt_logprobs", 0);
  if (request.echo && request.num_logprobs >= 0)
    request.options.num_prompt_logprobs =
        std::max(request.options.num_prompt_logprobs.value_or(0), request.num_logprobs);
  check_contract(request, limits, {});
  return request;
}

GenerationRequest parse_chat_request(const json& body, const ServerLimits& limits,
                                     const tokenizer::Tokenizer& tokenizer,
                                     const chat_template::ChatTemplate& chat_template) {
  const Fields fields(body, with_shared({"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                         "add_generation_prompt", "response_format", "tools", "tool_choice"}));
  GenerationRequest request;
  request.chat = true;
  request.options = shared_options(fields, limits);
  read_streaming(fields, request);
  request.return_token_ids = fields.boolean("return_token_ids", false);
  if (const json* format = fields.find("response_format")) check_response_format(*format);
  if (const json* tools = fields.find("tools"); tools && !(tools->is_array() && tools->empty()))
    bad_field("tools", "tool calls are not supported by jambo");
  if (const json* choice = fields.find("tool_choice"); choice && *choice != "none")
    bad_field("tool_choice", "tool calls are not supported by jambo; only \"none\"");
  request.prompts.push_back(chat_prompt(fields, tokenizer, chat_template));
  const bool has_max_completion = fields.find("max_completion_tokens") != nullptr;
  check_lengths(fields, request, limits, has_max_completion ? "max_completion_tokens" : "max_tokens", std::nullopt);
  const bool logprobs = fields.boolean("logprobs", false);
  const int64_t top_logprobs = fields.integer("top_logprobs", 0);
  if (fields.find("top_logprobs") && !logprobs) bad_field("top_logprobs", "needs 'logprobs': true");
  request.num_logprobs = logprobs ? top_logprobs : -1;
  request.options.num_top_logprobs = top_logprobs;
  check_contract(request, limits,
                 {{"prompt", "messages"},
                  {"logprobs", "top_logprobs"},
                  {"max_tokens", has_max_completion ? "max_completion_tokens" : "max_tokens"}});
  return request;
}

std::vector<int32_t> parse_tokenize_request(const json& body, const ServerLimits& limits,
                                            const tokenizer::Tokenizer& tokenizer,
                                            const chat_template::ChatTemplate* chat_template) {
  const Fields fields(body, {"model", "prompt", "add_special_tokens", "messages", "add_generation_prompt"});
  if (body.contains("prompt") == body.contains("messages"))
    throw ApiError(400, "give exactly one of 'prompt' and 'messages'", "prompt");
  if (body.contains("prompt")) {
    if (!body["prompt"].is_string()) bad_field("prompt", "must be a string");
    const json& special = body.contains("add_special_tokens") ? body["add_special_tokens"] : json(true);
    if (!special.is_boolean()) bad_field("add_special_tokens", "must be true or false");
    return tokenizer.encode(body["prompt"].get<std::string>(), special.get<bool>());
  }
  if (!chat_template) throw ApiError(400, "the model has no chat template", "messages");
  std::vector<int32_t> ids = chat_prompt(fields, tokenizer, *chat_template);
  context_room({ids}, limits, "messages");
  return ids;
}

std::vector<int32_t> parse_detokenize_request(const json& body, const ServerLimits& limits) {
  const Fields fields(body, {"model", "tokens"});
  const json* tokens = fields.find("tokens");
  if (!tokens || !tokens->is_array()) bad_field("tokens", "must be an array of token ids");
  std::vector<int32_t> ids = token_ids(*tokens, "tokens");
  for (int32_t id : ids)
    if (id >= limits.vocab_size)
      bad_field("tokens", fmt::format("holds {}, which is not a token id in [0, {})", id, limits.vocab_size));
  return ids;
}

}  // namespace jambo::server
