// config.json as load_config reads it, then the list of tensors the config asks the checkpoint for: the sizes it
// derives and every name and shape.
#include "fuzz_support.h"
#include "model/config.h"
#include "model/weight_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  const auto path = fuzz::write_scratch_file("config.json", fuzz::as_text(data, size));
  fuzz::refusing_bad_input([&] {
    const model::JambaConfig config = model::load_config(path);
    model::ModelWeights weights;
    (void)model::total_weight_bytes(model::list_weight_slots(config, weights));
  });
  return 0;
}
