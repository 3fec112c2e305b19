// tokenizer.json as Tokenizer::load reads it, then a text through encode, decode and the incremental decoder.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::write_scratch_file("tokenizer.json", fuzz::as_text(data, size));
  fuzz::refusing_bad_input([] {
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(fuzz::scratch_folder());
    const std::vector<int32_t> ids = tokenizer.encode("Hello  world! <|endoftext|> caf\xc3\xa9 \xe2\x96\x81 42\n\t");
    (void)tokenizer.decode(ids);
    (void)tokenizer.decode(ids, /*skip_special_tokens=*/true);
    tokenizer::IncrementalDecoder decoder(tokenizer);
    for (const int32_t id : ids) (void)decoder.push(id);
    (void)decoder.finish();
  });
  return 0;
}
