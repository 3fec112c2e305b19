// The body of POST /detokenize, then the ids it accepts decoded as the server answers them.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::refusing_bad_input([&] {
    const std::vector<int32_t> ids = server::parse_detokenize_request(
        server::parse_body(std::string(fuzz::as_text(data, size))), fuzz::demo_server_limits());
    (void)fuzz::demo_tokenizer().decode(ids);
  });
  return 0;
}
