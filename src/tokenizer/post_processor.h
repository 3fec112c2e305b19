// The "post_processor" of tokenizer.json: adds special tokens (BOS/EOS) around an encoded text
// when encoding with add_special_tokens (TemplateProcessing, Bert/RobertaProcessing, ByteLevel,
// Sequence).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace jambo::tokenizer {

class PostProcessor {
 public:
  PostProcessor() = default;  // adds nothing
  explicit PostProcessor(const JsonField& config);
  // The fallback of tokenizer.json files without a post_processor (tokenizer_config.json's
  // add_bos_token / add_eos_token).
  PostProcessor(std::optional<int32_t> bos_id, std::optional<int32_t> eos_id);

  std::vector<int32_t> add_special_tokens(const std::vector<int32_t>& ids) const;
  // The special tokens placed before the text: the BOS, when there is exactly one.
  std::optional<int32_t> leading_special_id() const;

 private:
  void add_steps(const JsonField& config);
  void read_template(const JsonField& config);
  // A later processor in a Sequence wraps the result of the earlier ones.
  void wrap(const std::vector<int32_t>& prefix, const std::vector<int32_t>& suffix);

  // The single-sequence template: special-token ids before and after the text.
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
};

}  // namespace jambo::tokenizer
