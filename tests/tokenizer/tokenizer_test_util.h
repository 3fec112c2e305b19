// Helpers shared by the tokenizer tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace jambo::test {

inline std::filesystem::path source_dir() { return JAMBO_SOURCE_DIR; }

// A hand-written tokenizer under tests/tokenizer/data/<name>.
inline tokenizer::Tokenizer load_test_tokenizer(const std::string& name) {
  return tokenizer::Tokenizer::load(source_dir() / "tests/tokenizer/data" / name);
}

// A fresh folder holding the given tokenizer.json text (for error cases).
inline std::filesystem::path write_tokenizer_folder(const std::string& name,
                                                    const std::string& json) {
  const auto folder = std::filesystem::temp_directory_path() / ("jambo-tokenizer-test-" + name);
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "tokenizer.json") << json;
  return folder;
}

}  // namespace jambo::test
