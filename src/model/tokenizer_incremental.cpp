// IncrementalDecoder: decodes a short window of recent ids and emits what the newest id added.
//
// The window starts with a context token that was already emitted, so the decoder's rules for
// the first token (Strip, Metaspace) apply to the context, not to new text. After each emission
// the window shrinks to the newest id, unless that id cannot serve as context: a <0xNN> byte token
// (a byte group must be decoded whole) or a special token that is being skipped (it would vanish
// and leave the first-token rules to new text). While the decoded window ends in U+FFFD, an
// incomplete character may still be completed by the next id, so nothing is emitted.
#include "model/tokenizer.h"
#include "model/tokenizer_decode.h"
#include "model/unicode.h"

namespace jambo {
namespace {

bool ends_with_replacement_char(const std::string& text) {
  static const std::string replacement = unicode::to_utf8(unicode::kReplacementChar);
  return text.ends_with(replacement);
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  if (text.size() < emitted_bytes_ || ends_with_replacement_char(text)) return "";
  std::string new_text = text.substr(emitted_bytes_);

  const auto token = tokenizer_.id_to_token(id);
  unsigned char byte;
  const bool is_byte_token = token && tokenizer_detail::parse_byte_token(*token, byte);
  const bool vanishes = skip_special_tokens_ && tokenizer_.is_special(id);
  if (is_byte_token || vanishes) {
    emitted_bytes_ = text.size();
  } else {
    ids_ = {id};
    emitted_bytes_ = tokenizer_.decode(ids_, skip_special_tokens_).size();
  }
  return new_text;
}

std::string IncrementalDecoder::finish() {
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  std::string rest = text.size() > emitted_bytes_ ? text.substr(emitted_bytes_) : "";
  ids_.clear();
  emitted_bytes_ = 0;
  return rest;
}

}  // namespace jambo
