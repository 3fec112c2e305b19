// The "normalizer" of tokenizer.json: string rewrites applied to the text between added tokens
// before pre-tokenization (Sequence, Prepend, Append, Replace, Strip, Lowercase).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace jambo::tokenizer {

class Normalizer {
 public:
  Normalizer() = default;  // the identity (tokenizer.json has "normalizer": null)
  explicit Normalizer(const JsonField& config);

  std::string normalize(std::string text) const;

 private:
  using Step = std::function<void(std::string&)>;
  void add_steps(const JsonField& config);

  std::vector<Step> steps_;
};

// The literal a Replace pattern stands for: {"String": s}, or a {"Regex": r} without regex syntax
// (which HF also treats literally). Anything else throws, naming the field.
std::string replace_pattern_literal(const JsonField& pattern);

}  // namespace jambo::tokenizer
