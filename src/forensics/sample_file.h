// Reads the samples `jambo compare` audits: JSONL written by `jambo batch` / `jambo generate --json`, or
// dumped by another engine (vLLM, Hugging Face transformers). A sample is a prompt, the ids generated
// after it and the logprob the engine reported for each generated id.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace jambo::forensics {

struct Sample {
  nlohmann::json id;                // a string or an integer: "id" or "request_id", else the line number
  int64_t sample = 0;               // which of the prompt's samples ("sample" or "index")
  int64_t line_number = 0;          // 1-based line in the input file
  std::vector<int32_t> prompt_ids;  // [num_prompt_tokens]
  std::vector<int32_t> ids;         // [num_generated]
  std::vector<double> logprobs;     // [num_generated] the engine's logprob of each generated id
  std::optional<std::string> backend;  // "backend": the jambo backend that made it (engine::describe), if said
};

struct MalformedLine {
  int64_t line_number = 0;
  std::string error;
};

struct SampleFile {
  std::vector<Sample> samples;                 // in input order
  std::vector<MalformedLine> malformed_lines;  // skipped, in input order
};

// The samples of one JSON line (a vLLM "outputs" list holds several), for a model of vocab_size
// tokens. Throws jambo::Error naming the field that makes the line unusable.
std::vector<Sample> parse_sample_line(const nlohmann::json& line, int64_t line_number, int64_t vocab_size);

// Every sample of a JSONL stream; a malformed line is recorded with its number and skipped.
SampleFile read_sample_file(std::istream& input, int64_t vocab_size);

// What parse_sample_line accepts, worded for --help and the README.
extern const char* const kSampleFormatHelp;

}  // namespace jambo::forensics
