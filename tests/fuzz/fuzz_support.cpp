#include "fuzz_support.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace jambo::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

class ScratchFolder {
 public:
  ScratchFolder() : path_(fs::temp_directory_path() / fmt::format("jambo-fuzz-{}", ::getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Conversation {
  ordered_json messages;
  ordered_json extra;  // more template variables: tools, documents
};

// Conversations that reach every branch of the Jamba templates: each role, content as a string, null and parts,
// tool calls with string and object arguments, tool results, tools and documents.
std::vector<Conversation> conversations() {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  const ordered_json documents = ordered_json::parse(R"([{"title": "Doc A", "text": "Alpha.", "source": "wiki"}])");
  const ordered_json chat = ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
      {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]}])");
  const ordered_json tool_turns = ordered_json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
      {"role": "tool", "content": "{\"temp\": 20}", "name": "get_weather"}])");
  return {{chat, ordered_json::object()}, {tool_turns, {{"tools", tools}}}, {chat, {{"documents", documents}}}};
}

}  // namespace

void refusing_bad_input(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
}

std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

const fs::path& scratch_folder() {
  static const ScratchFolder folder;
  return folder.path();
}

fs::path write_scratch_file(const std::string& name, std::string_view bytes) {
  const fs::path path = scratch_folder() / name;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), std::streamsize(bytes.size()));
  file.close();
  JAMBO_ASSERT(file.good());
  return path;
}

fs::path source_path(const std::string& relative) { return fs::path(JAMBO_SOURCE_DIR) / relative; }

fs::path seed_path(const std::string& relative) { return fs::path(JAMBO_FUZZ_SEEDS) / relative; }

const tokenizer::Tokenizer& demo_tokenizer() {
  static const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(source_path("models/jambo-demo"));
  return tokenizer;
}

const chat_template::ChatTemplate& demo_chat_template() {
  static const chat_template::ChatTemplate chat_template =
      chat_template::ChatTemplate::load(source_path("models/jambo-demo"));
  return chat_template;
}

server::ServerLimits demo_server_limits() {
  return {.model_name = "jambo-demo",
          .max_model_len = 4096,
          .max_n = 4,
          .max_num_prompts = 16,
          .vocab_size = demo_tokenizer().vocab_size()};
}

void for_each_line(std::string_view text, const std::function<void(const std::string&, int64_t)>& line_parser) {
  std::istringstream stream{std::string(text)};
  std::string line;
  for (int64_t line_number = 1; std::getline(stream, line); ++line_number) line_parser(line, line_number);
}

void render_conversations(const chat_template::ChatTemplate& chat_template) {
  static const auto cases = conversations();
  for (const Conversation& conversation : cases)
    for (const bool add_generation_prompt : {false, true})
      refusing_bad_input(
          [&] { (void)chat_template.render(conversation.messages, add_generation_prompt, conversation.extra); });
}

}  // namespace jambo::fuzz
