#include "forensics/sample_file.h"

#include "core/error.h"
#include "core/json.h"
#include "backend/logits_ops.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <string_view>

namespace jambo::forensics {

const char* const kSampleFormatHelp =
    R"(Input: JSONL, one sample per line; blank lines are ignored, a malformed line is reported with
its line number, skipped and counted. Each field is read from the first of its names present:
  prompt ids     prompt_ids | prompt_token_ids | input_ids
  generated ids  ids | token_ids | output_token_ids | generated_ids
                 | sequences (prompt then generated ids; must start with the prompt ids)
  logprobs       logprobs | scores: one entry per generated id, each one of
                   a number: the logprob of the generated id
                   a {"token_id": logprob} dict; a value may be an object {"logprob": x} (vLLM)
                   a list of [token_id, logprob] pairs
                   a row of vocab_size logits (transformers' output_logits, or the scores of
                   greedy generation), log-softmaxed here
                 a dict or pair list must hold the generated id
  id             id | request_id: a string or an integer (default: the line number)
  sample         sample | index (default: 0)
  backend        the jambo backend that made it, as jambo batch and stress write it (optional): where
                 every sample names the reference's own bitwise-invariant backend, the default
                 threshold is 0
A line with an "outputs" list (vLLM's RequestOutput) gives one sample per output; an output's
fields override the line's and its position is the default sample. Id lists and logit rows may be
wrapped as a batch of one ([[...]]), as transformers' tensors are.)";

namespace {

using nlohmann::json;

// A field found under one of its accepted names.
struct Field {
  std::string name;
  const json* value = nullptr;
};

// The first of `names` present in the line with a non-null value.
Field find_field(const json& line, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (line.contains(name) && !line[name].is_null()) return {name, &line[name]};
  return {};
}

Field require_field(const json& line, std::initializer_list<const char*> names, std::string_view what) {
  Field field = find_field(line, names);
  if (!field.value) fail("no {}: expected a field '{}'", what, fmt::join(names, "', '"));
  return field;
}

// transformers' tensors have a batch dimension: [[...]] with one row is read as that row.
const json& unwrap_batch_of_one(const json& value) {
  return value.is_array() && value.size() == 1 && value[0].is_array() ? value[0] : value;
}

std::vector<int32_t> parse_token_ids(const Field& field, int64_t vocab_size) {
  const json& list = unwrap_batch_of_one(*field.value);
  JAMBO_REQUIRE(list.is_array(), "field '{}' must be a list of token ids, got {}", field.name, describe_json(list));
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (const json& id : list) {
    JAMBO_REQUIRE(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size,
                  "field '{}' holds {}, which is not a token id below the vocabulary size {}", field.name,
                  describe_json(id), vocab_size);
    ids.push_back(int32_t(id.get<int64_t>()));
  }
  return ids;
}

double logprob_from_dict(const json& dict, int32_t token) {
  const std::string key = std::to_string(token);
  JAMBO_REQUIRE(dict.contains(key), "the generated id {} is not among its keys", token);
  const json& value = dict[key];
  if (value.is_number()) return value.get<double>();
  JAMBO_REQUIRE(value.is_object() && value.contains("logprob") && value["logprob"].is_number(),
                "the value of key {} is neither a number nor an object with a numeric 'logprob'", key);
  return value["logprob"].get<double>();
}

double logprob_from_pairs(const json& pairs, int32_t token) {
  for (const json& pair : pairs) {
    JAMBO_REQUIRE(pair.is_array() && pair.size() == 2 && pair[0].is_number_integer() && pair[1].is_number(),
                  "{} is not a [token_id, logprob] pair (nor is the entry a row of logits)", describe_json(pair));
    if (pair[0].get<int64_t>() == token) return pair[1].get<double>();
  }
  fail("the generated id {} is not among its [token_id, logprob] pairs", token);
}

double logprob_from_row(const json& row, int32_t token) {
  std::vector<float> logits;
  logits.reserve(row.size());
  for (const json& logit : row) {
    JAMBO_REQUIRE(logit.is_number(), "the row of logits holds {}", describe_json(logit));
    logits.push_back(logit.get<float>());
  }
  return double(logits[token]) - backend::log_sum_exp(logits);
}

// The logprob of the generated id `token` from one position's entry of a logprobs list.
double generated_logprob(const json& entry, int32_t token, int64_t vocab_size) {
  if (entry.is_number()) return entry.get<double>();
  // NaN and infinities are written as null (JSON has neither): a broken logprob, to be flagged, not skipped.
  if (entry.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (entry.is_object()) return logprob_from_dict(entry, token);
  JAMBO_REQUIRE(entry.is_array() && !entry.empty(),
                "expected a number, a {{token_id: logprob}} dict, [token_id, logprob] pairs or a row of logits; got {}",
                describe_json(entry));
  const json& row = unwrap_batch_of_one(entry);
  if (int64_t(row.size()) == vocab_size && row[0].is_number()) return logprob_from_row(row, token);
  return logprob_from_pairs(entry, token);
}

std::vector<double> parse_logprobs(const Field& field, const std::vector<int32_t>& ids, int64_t vocab_size) {
  const json& list = *field.value;
  JAMBO_REQUIRE(list.is_array(), "field '{}' must be a list, got {}", field.name, describe_json(list));
  JAMBO_REQUIRE(list.size() == ids.size(), "field '{}' has {} entries for {} generated ids", field.name, list.size(),
                ids.size());
  std::vector<double> logprobs;
  logprobs.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      logprobs.push_back(generated_logprob(list[i], ids[i], vocab_size));
    } catch (const Error& error) {
      fail("field '{}', entry {}: {}", field.name, i, error.what());
    }
  }
  return logprobs;
}

std::vector<int32_t> parse_generated_ids(const json& line, const std::vector<int32_t>& prompt, int64_t vocab_size) {
  const Field field =
      require_field(line, {"ids", "token_ids", "output_token_ids", "generated_ids", "sequences"}, "generated ids");
  std::vector<int32_t> ids = parse_token_ids(field, vocab_size);
  if (field.name != "sequences") return ids;
  JAMBO_REQUIRE(ids.size() >= prompt.size() && std::equal(prompt.begin(), prompt.end(), ids.begin()),
                "field 'sequences' does not start with the {} prompt ids", prompt.size());
  ids.erase(ids.begin(), ids.begin() + prompt.size());
  return ids;
}

// One sample from a line (or a vLLM output merged into its line).
Sample parse_one_sample(const json& line, int64_t line_number, int64_t vocab_size) {
  Sample sample;
  sample.line_number = line_number;
  const Field id = find_field(line, {"id", "request_id"});
  JAMBO_REQUIRE(!id.value || id.value->is_string() || id.value->is_number_integer(),
                "field '{}' must be a string or an integer, got {}", id.name, describe_json(*id.value));
  sample.id = id.value ? *id.value : json(line_number);
  const Field index = find_field(line, {"sample", "index"});
  if (index.value) {
    JAMBO_REQUIRE(index.value->is_number_integer() && index.value->get<int64_t>() >= 0,
                  "field '{}' must be an integer >= 0, got {}", index.name, describe_json(*index.value));
    sample.sample = index.value->get<int64_t>();
  }
  const Field prompt = require_field(line, {"prompt_ids", "prompt_token_ids", "input_ids"}, "prompt ids");
  sample.prompt_ids = parse_token_ids(prompt, vocab_size);
  JAMBO_REQUIRE(!sample.prompt_ids.empty(), "field '{}' is empty: a prompt has at least one token", prompt.name);
  sample.ids = parse_generated_ids(line, sample.prompt_ids, vocab_size);
  const Field logprobs = require_field(line, {"logprobs", "scores"}, "logprobs of the generated ids");
  sample.logprobs = parse_logprobs(logprobs, sample.ids, vocab_size);
  const Field backend = find_field(line, {"backend"});
  if (backend.value) {
    JAMBO_REQUIRE(backend.value->is_string(), "field 'backend' must be a string, got {}", describe_json(*backend.value));
    sample.backend = backend.value->get<std::string>();
  }
  return sample;
}

}  // namespace

std::vector<Sample> parse_sample_line(const json& line, int64_t line_number, int64_t vocab_size) {
  JAMBO_REQUIRE(line.is_object(), "expected a JSON object, got {}", describe_json(line));
  const Field outputs = find_field(line, {"outputs"});
  if (!outputs.value) return {parse_one_sample(line, line_number, vocab_size)};
  JAMBO_REQUIRE(outputs.value->is_array(), "field 'outputs' must be a list, got {}", describe_json(*outputs.value));
  std::vector<Sample> samples;
  for (size_t i = 0; i < outputs.value->size(); ++i) {
    const json& output = (*outputs.value)[i];
    JAMBO_REQUIRE(output.is_object(), "outputs[{}] must be an object, got {}", i, describe_json(output));
    json merged = line;
    merged.erase("outputs");
    merged.update(output);
    if (!find_field(merged, {"sample", "index"}).value) merged["sample"] = i;
    try {
      samples.push_back(parse_one_sample(merged, line_number, vocab_size));
    } catch (const Error& error) {
      fail("outputs[{}]: {}", i, error.what());
    }
  }
  return samples;
}

SampleFile read_sample_file(std::istream& input, int64_t vocab_size) {
  SampleFile file;
  std::string text;
  for (int64_t line_number = 1; std::getline(input, text); ++line_number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      for (Sample& sample : parse_sample_line(parse_json(text), line_number, vocab_size))
        file.samples.push_back(std::move(sample));
    } catch (const Error& error) {
      file.malformed_lines.push_back({line_number, error.what()});
    }
  }
  return file;
}

}  // namespace jambo::forensics
