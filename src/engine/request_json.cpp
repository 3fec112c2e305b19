#include "engine/request_json.h"

#include "core/error.h"
#include "core/json.h"

#include <set>

namespace jambo::engine {
namespace {

using nlohmann::json;

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields = {"id",   "prompt", "prompt_ids", "n",        "max_tokens",
                                               "temperature", "top_p",  "top_k",      "min_p",    "seed",
                                               "logprobs",    "prompt_logprobs",      "stop",     "stop_token_ids",
                                               "return_routed_experts"};
  return fields;
}

int64_t integer_field(const json& line, const char* name) {
  const json& value = line.at(name);
  JAMBO_REQUIRE(value.is_number_integer(), "field '{}' must be an integer, got {}", name, describe_json(value));
  const std::optional<int64_t> integer = json_int64(value);
  JAMBO_REQUIRE(integer, "field '{}' = {} is out of range", name, value.dump());
  return *integer;
}

// Any 64-bit pattern: an unsigned integer up to 2^64-1, or a signed one taken modulo 2^64.
uint64_t seed_field(const json& line) {
  const json& value = line.at("seed");
  return value.is_number_unsigned() ? value.get<uint64_t>() : uint64_t(integer_field(line, "seed"));
}

bool boolean_field(const json& line, const char* name) {
  const json& value = line.at(name);
  JAMBO_REQUIRE(value.is_boolean(), "field '{}' must be true or false, got {}", name, describe_json(value));
  return value.get<bool>();
}

double number_field(const json& line, const char* name) {
  const json& value = line.at(name);
  JAMBO_REQUIRE(value.is_number(), "field '{}' must be a number, got {}", name, describe_json(value));
  return value.get<double>();
}

std::vector<int32_t> token_ids_field(const json& line, const char* name) {
  const json& value = line.at(name);
  JAMBO_REQUIRE(value.is_array(), "field '{}' must be an array of token ids", name);
  std::vector<int32_t> ids;
  for (const json& id : value) {
    JAMBO_REQUIRE(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX,
                  "field '{}' holds {}, which is not a token id", name, describe_json(id));
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

std::vector<std::string> stop_strings_field(const json& line) {
  const json& value = line.at("stop");
  if (value.is_string()) return {value.get<std::string>()};
  JAMBO_REQUIRE(value.is_array(), "field 'stop' must be a string or an array of strings");
  std::vector<std::string> stops;
  for (const json& stop : value) {
    JAMBO_REQUIRE(stop.is_string(), "field 'stop' holds {}, which is not a string", describe_json(stop));
    stops.push_back(stop.get<std::string>());
  }
  return stops;
}

std::vector<int32_t> prompt_field(const json& line, const tokenizer::Tokenizer* tokenizer) {
  const bool has_text = line.contains("prompt"), has_ids = line.contains("prompt_ids");
  JAMBO_REQUIRE(has_text != has_ids, "give exactly one of the fields 'prompt' and 'prompt_ids'");
  if (has_ids) return token_ids_field(line, "prompt_ids");
  JAMBO_REQUIRE(line["prompt"].is_string(), "field 'prompt' must be a string");
  JAMBO_REQUIRE(tokenizer != nullptr, "field 'prompt' needs the model's tokenizer.json; give 'prompt_ids' instead");
  return tokenizer->encode(line["prompt"].get<std::string>());
}

}  // namespace

std::string request_id(const json& line, const std::string& default_id) {
  if (!line.is_object() || !line.contains("id")) return default_id;
  const json& id = line["id"];
  JAMBO_REQUIRE(id.is_string() || id.is_number_integer(), "field 'id' must be a string or an integer");
  return id.is_string() ? id.get<std::string>() : describe_json(id);
}

RequestSpec request_from_json(const json& line, const RequestSpec& defaults, const tokenizer::Tokenizer* tokenizer) {
  JAMBO_REQUIRE(line.is_object(), "a request must be a JSON object");
  for (const auto& [name, value] : line.items())
    JAMBO_REQUIRE(known_fields().count(name), "unknown field '{}'", name);
  RequestSpec spec = defaults;
  spec.id = request_id(line, defaults.id);
  spec.prompt_ids = prompt_field(line, tokenizer);
  if (line.contains("n")) spec.n = integer_field(line, "n");
  if (line.contains("max_tokens")) spec.stop.max_tokens = integer_field(line, "max_tokens");
  if (line.contains("temperature")) spec.sampling.temperature = number_field(line, "temperature");
  if (line.contains("top_p")) spec.sampling.top_p = number_field(line, "top_p");
  if (line.contains("top_k")) spec.sampling.top_k = integer_field(line, "top_k");
  if (line.contains("min_p")) spec.sampling.min_p = number_field(line, "min_p");
  if (line.contains("seed")) spec.sampling.seed = seed_field(line);
  if (line.contains("logprobs")) spec.num_top_logprobs = integer_field(line, "logprobs");
  if (line.contains("prompt_logprobs")) spec.num_prompt_logprobs = integer_field(line, "prompt_logprobs");
  if (line.contains("stop")) spec.stop.strings = stop_strings_field(line);
  if (line.contains("stop_token_ids")) spec.stop.token_ids = token_ids_field(line, "stop_token_ids");
  if (line.contains("return_routed_experts"))
    spec.return_routed_experts = boolean_field(line, "return_routed_experts");
  return spec;
}

json top_logprobs_to_json(const std::vector<backend::TokenLogprob>& entries) {
  json out = json::array();
  for (const backend::TokenLogprob& entry : entries) out.push_back({entry.token, entry.logprob});
  return out;
}

json weight_versions_to_json(const std::vector<WeightVersionSpan>& spans) {
  json out = json::array();
  for (const WeightVersionSpan& span : spans)
    out.push_back({{"version", span.version}, {"start", span.start}, {"end", span.end}});
  return out;
}

json sample_to_json(const SampleOutput& sample, std::string_view backend) {
  json top = json::array();
  for (const auto& entries : sample.top_logprobs) top.push_back(top_logprobs_to_json(entries));
  json out = {{"id", sample.id},         {"sample", sample.sample},     {"prompt_ids", sample.prompt_ids},
              {"ids", sample.ids},       {"text", sample.text},         {"logprobs", sample.logprobs},
              {"top_logprobs", top},     {"finish_reason", sample.finish_reason}, {"backend", backend},
              {"weight_versions", weight_versions_to_json(sample.weight_versions)}};
  if (!sample.prompt_logprobs.empty()) {
    json prompt = json::array(), prompt_top = json::array();
    for (size_t i = 0; i < sample.prompt_logprobs.size(); ++i) {
      prompt.push_back(sample.prompt_logprobs[i] ? json(*sample.prompt_logprobs[i]) : json(nullptr));
      prompt_top.push_back(i == 0 ? json(nullptr) : top_logprobs_to_json(sample.prompt_top_logprobs[i]));
    }
    out["prompt_logprobs"] = prompt;
    out["prompt_top_logprobs"] = prompt_top;
  }
  if (!sample.prompt_routed_experts.empty()) {  // [tokens][MoE layers][k]
    out["prompt_routed_experts"] = sample.prompt_routed_experts;
    out["routed_experts"] = sample.routed_experts;
  }
  return out;
}

}  // namespace jambo::engine
