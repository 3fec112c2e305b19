// model.safetensors as Checkpoint::open reads it: the 8-byte header length, the JSON header, the data. Every tensor
// it accepts is read through to its last byte, so a view reaching outside the file shows.
#include "fuzz_support.h"
#include "model/safetensors.h"

namespace jambo::fuzz {

void read_every_tensor(const model::Checkpoint& checkpoint) {
  uint8_t checksum = 0;
  for (const std::string& name : checkpoint.names()) {
    const TensorView& view = *checkpoint.find(name);
    const auto* bytes = static_cast<const uint8_t*>(view.data);
    for (int64_t i = 0; i < view.numel() * int64_t(dtype_size(view.dtype)); ++i) checksum ^= bytes[i];
  }
  volatile uint8_t keep = checksum;
  (void)keep;
}

}  // namespace jambo::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::write_scratch_file("model.safetensors", fuzz::as_text(data, size));
  fuzz::refusing_bad_input([] { fuzz::read_every_tensor(model::Checkpoint::open(fuzz::scratch_folder())); });
  return 0;
}
