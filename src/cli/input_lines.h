// The parsers of one input line of `jambo score` and of `jambo batch`. Each throws jambo::Error saying what is
// wrong with the line, which the command reports with the line number before skipping the line.
#pragma once

#include "engine/request_spec.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace jambo::cli {

struct ScoreInput {
  int64_t line_number = 0;
  nlohmann::json id;
  std::vector<int32_t> tokens;
  bool from_text = false;  // the line gave "text": the output names its tokens
};

// One {"id": ..., "tokens": [ids]} or {"id": ..., "text": "..."} line; "text" is tokenized as `generate --prompt`
// tokenizes a prompt (special tokens added).
ScoreInput parse_score_line(const std::string& line, int64_t line_number, const tokenizer::Tokenizer* tokenizer);

// One request line: its fields over `defaults`, the id defaulting to the line number.
engine::RequestSpec parse_batch_line(const std::string& line, int64_t line_number, engine::RequestSpec defaults,
                                     const tokenizer::Tokenizer* tokenizer);

}  // namespace jambo::cli
