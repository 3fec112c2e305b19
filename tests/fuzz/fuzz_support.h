// What the fuzz targets share: the rule for what a parser may do with bad input, a scratch folder for the loaders
// that read files, and the demo model's tokenizer and chat template for the parsers that need them.
#pragma once

#include "chat_template/chat_template.h"
#include "core/error.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace jambo::fuzz {

// Runs `parse`. A parser refuses bad input with jambo::Error, so that is swallowed; anything else (an InternalError,
// a library's exception, a crash, a sanitizer report) reaches libFuzzer as a finding.
void refusing_bad_input(const std::function<void()>& parse);

std::string_view as_text(const uint8_t* data, size_t size);

// The loaders read files, so a target writes its input into a folder of its own (under the temp directory, named
// after the process, removed at exit) and hands the loader that folder or file.
const std::filesystem::path& scratch_folder();
std::filesystem::path write_scratch_file(const std::string& name, std::string_view bytes);

// A file or folder of the source tree, e.g. "models/jambo-demo", or of the seed corpora (make_seeds.sh).
std::filesystem::path source_path(const std::string& relative);
std::filesystem::path seed_path(const std::string& relative);

// Loaded once, from models/jambo-demo.
const tokenizer::Tokenizer& demo_tokenizer();
const chat_template::ChatTemplate& demo_chat_template();

// What the server would take with the demo model: its name, 4096 tokens, 4 samples, 16 prompts.
server::ServerLimits demo_server_limits();

// Calls `line_parser` on each line of the input as std::getline splits it, the way the JSONL readers read a file.
void for_each_line(std::string_view text, const std::function<void(const std::string&, int64_t)>& line_parser);

// Renders `chat_template` over a fixed set of conversations (system, user, assistant and tool turns, content parts,
// tool calls, tools), each with and without the generation prompt.
void render_conversations(const chat_template::ChatTemplate& chat_template);

}  // namespace jambo::fuzz
