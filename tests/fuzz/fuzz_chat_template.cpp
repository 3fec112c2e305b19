// A chat template's Jinja source, parsed and rendered over a fixed set of conversations.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::refusing_bad_input([&] {
    fuzz::render_conversations(
        chat_template::ChatTemplate::parse(std::string(fuzz::as_text(data, size)), "<|startoftext|>", "<|endoftext|>"));
  });
  return 0;
}
