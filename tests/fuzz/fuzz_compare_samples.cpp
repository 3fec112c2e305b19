// The sample files `jambo compare` reads (jambo's, vLLM's and transformers' formats), for the demo model's
// vocabulary, so that rows of logits are log-softmaxed too.
#include "forensics/sample_file.h"
#include "fuzz_support.h"

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  std::istringstream input{std::string(fuzz::as_text(data, size))};
  fuzz::refusing_bad_input([&] { (void)forensics::read_sample_file(input, fuzz::demo_tokenizer().vocab_size()); });
  return 0;
}
