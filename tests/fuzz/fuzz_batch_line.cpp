// The --input lines of `jambo batch`, read with the demo model's tokenizer, each request then checked against the
// request contract as the engine checks it when the request is added.
#include "cli/input_lines.h"
#include "engine/request_spec.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::for_each_line(fuzz::as_text(data, size), [](const std::string& line, int64_t line_number) {
    fuzz::refusing_bad_input([&] {
      const tokenizer::Tokenizer& tokenizer = fuzz::demo_tokenizer();
      const engine::RequestSpec spec = cli::parse_batch_line(line, line_number, engine::RequestSpec{}, &tokenizer);
      (void)engine::validate(
          spec, {.vocab_size = tokenizer.vocab_size(), .max_model_len = 4096, .max_n = 8, .has_tokenizer = true});
    });
  });
  return 0;
}
