// A --trace file as `jambo trace` reads it: the life of a request by its id, and of a sequence by its number.
#include "forensics/trace_reader.h"
#include "fuzz_support.h"

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  const std::string text(fuzz::as_text(data, size));
  std::istringstream by_request(text), by_sequence(text);
  fuzz::refusing_bad_input([&] { (void)forensics::read_request_life(by_request, "1"); });
  fuzz::refusing_bad_input([&] { (void)forensics::read_sequence_life(by_sequence, 0); });
  return 0;
}
