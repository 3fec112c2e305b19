// The body of POST /tokenize (a prompt, or messages through the demo model's chat template).
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::refusing_bad_input([&] {
    (void)server::parse_tokenize_request(server::parse_body(std::string(fuzz::as_text(data, size))),
                                         fuzz::demo_server_limits(), fuzz::demo_tokenizer(),
                                         &fuzz::demo_chat_template());
  });
  return 0;
}
