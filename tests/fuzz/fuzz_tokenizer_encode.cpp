// Text through each fixture tokenizer (both families): encode with and without special tokens, decode, the
// incremental decoder. The first byte picks the tokenizer, the rest is the text.
#include "fuzz_support.h"

#include <array>

namespace {

const jambo::tokenizer::Tokenizer& fixture_tokenizer(uint8_t choice) {
  static const std::array<jambo::tokenizer::Tokenizer, 5> tokenizers = [] {
    auto load = [](const char* name) {
      return jambo::tokenizer::Tokenizer::load(jambo::fuzz::source_path("tests/fixtures/tokenizers") / name);
    };
    return std::array{load("sp-jamba"), load("sp-prepend"), load("metaspace"), load("bytelevel"), load("jambo-demo")};
  }();
  return tokenizers[choice % tokenizers.size()];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  if (size == 0) return 0;
  const tokenizer::Tokenizer& tokenizer = fixture_tokenizer(data[0]);
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  (void)tokenizer.encode(text, /*add_special_tokens=*/false);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  (void)tokenizer.decode(ids, /*skip_special_tokens=*/true);
  tokenizer::IncrementalDecoder decoder(tokenizer);
  std::string streamed;
  for (const int32_t id : ids) streamed += decoder.push(id);
  streamed += decoder.finish();
  // The incremental decoder promises the text decode() gives for the whole sequence.
  JAMBO_ASSERT(streamed == tokenizer.decode(ids));
  return 0;
}
