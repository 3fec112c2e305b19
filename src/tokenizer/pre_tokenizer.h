// The "pre_tokenizer" of tokenizer.json: cuts normalized text into the words the BPE model sees
// (Sequence, Metaspace, ByteLevel, Split).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace jambo::tokenizer {

struct TextPiece {
  std::string text;
  // Starts at offset 0 of the input text (Metaspace's prepend_scheme "first" looks at it).
  bool at_text_start;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;  // leaves each piece whole ("pre_tokenizer": null)
  explicit PreTokenizer(const JsonField& config);

  std::vector<TextPiece> pre_tokenize(std::vector<TextPiece> pieces) const;

  // One pre-tokenizer: cuts (and may rewrite) one piece.
  using Step = std::function<std::vector<TextPiece>(const TextPiece&)>;

 private:
  void add_steps(const JsonField& config);

  std::vector<Step> steps_;
};

// Metaspace's "prepend_scheme" (pre-tokenizer and decoder), or its older "add_prefix_space".
enum class PrependScheme { kAlways, kFirst, kNever };
PrependScheme parse_prepend_scheme(const JsonField& config);

// The GPT-2 byte-to-unicode map: each byte as the printable character that stands for it.
char32_t byte_to_char(unsigned char byte);
// The inverse; false when c stands for no byte.
bool char_to_byte(char32_t c, unsigned char& byte);

}  // namespace jambo::tokenizer
