// model.safetensors.index.json as Checkpoint::open reads it, in a folder holding the shards of the sharded fixture
// checkpoint (linked, not copied).
#include "fuzz_support.h"
#include "model/safetensors.h"

#include <filesystem>

namespace {

namespace fs = std::filesystem;

void link_fixture_shards() {
  const fs::path fixture = jambo::fuzz::source_path("tests/fixtures/models/sharded-gqa4-bf16");
  for (const fs::directory_entry& entry : fs::directory_iterator(fixture))
    if (entry.path().extension() == ".safetensors")
      fs::create_symlink(entry.path(), jambo::fuzz::scratch_folder() / entry.path().filename());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  link_fixture_shards();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::write_scratch_file("model.safetensors.index.json", fuzz::as_text(data, size));
  fuzz::refusing_bad_input([] { (void)model::Checkpoint::open(fuzz::scratch_folder()).names(); });
  return 0;
}
