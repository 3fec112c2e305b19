// The "decoder" of tokenizer.json: turns token strings back into text (Sequence, Replace,
// ByteFallback, Fuse, Strip, Metaspace, ByteLevel), as HF's decode_chain.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace jambo::tokenizer {

class Decoder {
 public:
  Decoder() = default;  // "decoder": null: tokens are joined with spaces, as HF does
  explicit Decoder(const JsonField& config);

  std::string decode(std::vector<std::string> tokens) const;

 private:
  using Step = std::function<void(std::vector<std::string>&)>;
  void add_steps(const JsonField& config);

  bool configured_ = false;
  std::vector<Step> steps_;
};

// The byte a "<0xNN>" token stands for; false for any other token.
bool parse_byte_token(const std::string& token, unsigned char& byte);

}  // namespace jambo::tokenizer
