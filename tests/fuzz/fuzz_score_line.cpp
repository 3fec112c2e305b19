// The --input lines of `jambo score`, read with the demo model's tokenizer (for "text" lines).
#include "cli/input_lines.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::for_each_line(fuzz::as_text(data, size), [](const std::string& line, int64_t line_number) {
    fuzz::refusing_bad_input([&] { (void)cli::parse_score_line(line, line_number, &fuzz::demo_tokenizer()); });
  });
  return 0;
}
