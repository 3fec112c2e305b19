#include "tokenizer/post_processor.h"

#include "core/error.h"

namespace jambo::tokenizer {

PostProcessor::PostProcessor(const JsonField& config) { add_steps(config); }

PostProcessor::PostProcessor(std::optional<int32_t> bos_id, std::optional<int32_t> eos_id) {
  if (bos_id) prefix_ids_.push_back(*bos_id);
  if (eos_id) suffix_ids_.push_back(*eos_id);
}

void PostProcessor::add_steps(const JsonField& config) {
  const std::string type = config.type();
  if (type == "Sequence") {
    const JsonField processors = config.at("processors");
    for (size_t i = 0; i < processors.size(); ++i) add_steps(processors.at(i));
  } else if (type == "TemplateProcessing") {
    read_template(config);
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {  // [cls] text [sep]
    wrap({static_cast<int32_t>(config.at("cls").at(1).as_int())},
         {static_cast<int32_t>(config.at("sep").at(1).as_int())});
  } else if (type != "ByteLevel") {  // ByteLevel only trims offsets, which jambo does not track
    config.fail(
        fmt::format("post_processor type '{}' is not supported (supported: Sequence, "
                    "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel)",
                    type));
  }
}

// "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}, ...], where each special
// token's ids are listed under "special_tokens".
void PostProcessor::read_template(const JsonField& config) {
  const JsonField pieces = config.at("single");
  const JsonField special_tokens = config.at("special_tokens");
  std::vector<int32_t> prefix, suffix;
  size_t num_sequences = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const JsonField piece = pieces.at(i);
    if (piece.find("Sequence")) {
      ++num_sequences;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").as_string();
    const JsonField ids = special_tokens.at(name).at("ids");
    std::vector<int32_t>& target = num_sequences == 0 ? prefix : suffix;
    for (size_t k = 0; k < ids.size(); ++k)
      target.push_back(static_cast<int32_t>(ids.at(k).as_int()));
  }
  if (num_sequences != 1)
    pieces.fail("the single-sequence template must contain exactly one Sequence");
  wrap(prefix, suffix);
}

void PostProcessor::wrap(const std::vector<int32_t>& prefix, const std::vector<int32_t>& suffix) {
  prefix_ids_.insert(prefix_ids_.begin(), prefix.begin(), prefix.end());
  suffix_ids_.insert(suffix_ids_.end(), suffix.begin(), suffix.end());
}

std::vector<int32_t> PostProcessor::add_special_tokens(const std::vector<int32_t>& ids) const {
  std::vector<int32_t> out = prefix_ids_;
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::optional<int32_t> PostProcessor::leading_special_id() const {
  if (prefix_ids_.size() != 1) return std::nullopt;
  return prefix_ids_[0];
}

}  // namespace jambo::tokenizer
