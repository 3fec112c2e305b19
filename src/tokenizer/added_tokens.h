// The "added_tokens" of tokenizer.json: tokens found in the text before the model sees it, with
// HF's matching rules (leftmost-longest, single_word, lstrip, rstrip; "normalized" tokens are
// matched in the normalized text, the others in the raw text).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/normalizer.h"

namespace jambo::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A stretch of text: either one added token or text for the rest of the pipeline.
struct Segment {
  std::string text;
  std::optional<int32_t> token_id;
  bool at_text_start;  // begins at offset 0 of the input
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // As HF, a token whose content is in the model's vocabulary takes the model's id. Every declared id is below
  // id_limit.
  AddedVocabulary(const JsonField& added_tokens, int64_t id_limit, const Normalizer& normalizer,
                  const BpeModel& model);

  // Cuts text at the added tokens of one kind: raw-text tokens (before normalization) or
  // normalized ones (in normalized text).
  std::vector<Segment> split_raw(std::string_view text, bool at_text_start) const {
    return raw_matcher_.split(text, at_text_start, tokens_);
  }
  std::vector<Segment> split_normalized(std::string_view text, bool at_text_start) const {
    return normalized_matcher_.split(text, at_text_start, tokens_);
  }

  const AddedToken* find(int32_t id) const;
  std::optional<int32_t> find(std::string_view content) const;
  int64_t max_id() const;

 private:
  // Leftmost-longest, non-overlapping search for a set of patterns (HF uses Aho-Corasick).
  class Matcher {
   public:
    void add(std::string pattern, size_t token_index);
    std::vector<Segment> split(std::string_view text, bool at_text_start,
                               const std::vector<AddedToken>& tokens) const;

   private:
    struct Pattern {
      std::string text;
      size_t token_index;
    };
    struct Match {
      size_t begin, end, token_index;
    };
    std::vector<Match> find_all(std::string_view text) const;
    std::vector<Pattern> patterns_by_first_byte_[256];  // longest first
  };

  void add(AddedToken token, const Normalizer& normalizer);

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> index_by_id_;
  std::unordered_map<std::string, size_t> index_by_content_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
};

}  // namespace jambo::tokenizer
