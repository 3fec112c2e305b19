// The body of POST /v1/completions, as the server reads it for the demo model.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::refusing_bad_input([&] {
    (void)server::parse_completion_request(server::parse_body(std::string(fuzz::as_text(data, size))),
                                           fuzz::demo_server_limits(), fuzz::demo_tokenizer());
  });
  return 0;
}
