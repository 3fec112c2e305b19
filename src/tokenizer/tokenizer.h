// Tokenizer: Hugging Face tokenizer.json (BPE with merges) in the SentencePiece style (Prepend/Replace
// normalizer or Metaspace pre-tokenizer, byte fallback) and the byte-level (GPT-2) style; added and
// special tokens, the TemplateProcessing post-processor and the decoder chain, as HF tokenizers does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace jambo::tokenizer {

class Tokenizer {
 public:
  // Reads folder/tokenizer.json and, when present, folder/tokenizer_config.json.
  static Tokenizer load(const std::filesystem::path& folder);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens: apply the post-processor (BOS/EOS), as HF's encode(add_special_tokens=True).
  // Invalid UTF-8 in text is read as U+FFFD (HF only ever sees valid strings).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Decodes through the decoder chain; special tokens are kept unless skip_special_tokens, and ids
  // without a token are skipped (as HF does).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // model vocab plus added tokens (highest id + 1)
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;  // the token as stored, e.g. "▁the"
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of generated ids into text pieces; never emits a broken UTF-8 sequence (bytes of an
// incomplete character wait for the next id) and decodes with the full context so that the decoder's
// leading-space rules match decode() of the whole sequence.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);  // the new text this id completes (possibly empty)
  std::string finish();          // whatever is left (an incomplete tail as U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t emitted_bytes_ = 0;
};

}  // namespace jambo::tokenizer
