// IncrementalDecoder: decodes a short window of recent ids and emits what the newest id added.
//
// Ids that decode() drops (unknown ids, special tokens being skipped) are ignored outright: in
// the window they would split a run of byte tokens or hide the first token. The window starts
// with a context token that was already emitted, so the decoder's rules for the first token
// (Strip, Metaspace) apply to the context, not to new text. Nothing is emitted
//  - while the newest id is a <0xNN> byte token: ByteFallback decodes a run of them as a whole
//    (its UTF-8, or one U+FFFD per byte when invalid), so a run is final only once it ends;
//  - while the decoded window ends in U+FFFD: the next id may complete the character.
// After each emission the window shrinks to the newest id.
#include "tokenizer/tokenizer.h"
#include "tokenizer/decoder.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {
namespace {

bool ends_with_replacement_char(const std::string& text) {
  static const std::string replacement = unicode::to_utf8(unicode::kReplacementChar);
  return text.ends_with(replacement);
}

bool is_byte_token(const Tokenizer& tokenizer, int32_t id) {
  const auto token = tokenizer.id_to_token(id);
  unsigned char byte;
  return token && tokenizer::parse_byte_token(*token, byte);
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  const bool dropped_by_decode =
      !tokenizer_.id_to_token(id) || (skip_special_tokens_ && tokenizer_.is_special(id));
  if (dropped_by_decode) return "";
  ids_.push_back(id);
  if (is_byte_token(tokenizer_, id)) return "";
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  if (text.size() < emitted_bytes_ || ends_with_replacement_char(text)) return "";
  std::string new_text = text.substr(emitted_bytes_);
  ids_ = {id};
  emitted_bytes_ = tokenizer_.decode(ids_, skip_special_tokens_).size();
  return new_text;
}

std::string IncrementalDecoder::finish() {
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  std::string rest = text.size() > emitted_bytes_ ? text.substr(emitted_bytes_) : "";
  ids_.clear();
  emitted_bytes_ = 0;
  return rest;
}

}  // namespace jambo::tokenizer
