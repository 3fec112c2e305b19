// tokenizer_config.json beside the demo model's tokenizer.json (its small seed: the whole one takes longer to load
// than the config), as Tokenizer::load and ChatTemplate::load read it; the chat template it holds is then rendered
// over a fixed set of conversations.
#include "fuzz_support.h"

#include <filesystem>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::filesystem::path tokenizer_json = jambo::fuzz::seed_path("tokenizer/jambo-demo-small.json");
  JAMBO_REQUIRE(std::filesystem::exists(tokenizer_json), "{}: not found; build the fuzz_seeds target",
                tokenizer_json.string());
  std::filesystem::create_symlink(tokenizer_json, jambo::fuzz::scratch_folder() / "tokenizer.json");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  fuzz::write_scratch_file("tokenizer_config.json", fuzz::as_text(data, size));
  fuzz::refusing_bad_input([] { (void)tokenizer::Tokenizer::load(fuzz::scratch_folder()).encode("Hello world"); });
  fuzz::refusing_bad_input(
      [] { fuzz::render_conversations(chat_template::ChatTemplate::load(fuzz::scratch_folder())); });
  return 0;
}
