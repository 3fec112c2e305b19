// A model's chat template: the Jinja program in its tokenizer_config.json that turns an OpenAI
// "messages" array into the prompt text, rendered as transformers' apply_chat_template does.
#pragma once

#include "chat_template/jinja_template.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace jambo::chat_template {

class ChatTemplate {
 public:
  // Reads folder/chat_template.jinja when present (newer transformers save it there), else
  // "chat_template" from folder/tokenizer_config.json (a string, or a list of {name, template}
  // where "default" is taken), and the special tokens (bos_token, eos_token, ...: a string or
  // {"content": ...}). Throws jambo::Error naming the file when there is no template or it does
  // not parse (with line, column and what was expected).
  static ChatTemplate load(const std::filesystem::path& folder);
  static ChatTemplate parse(std::string source, std::string bos_token, std::string eos_token);

  // messages: the OpenAI "messages" array (role; content as a string, null or a list of
  // {"type": "text", "text": ...} parts, which are joined with "\n"; tool_calls, name, ...).
  // extra: more template variables, such as tools, documents or a template's own switches.
  // Ordered JSON, so that tool schemas keep the client's key order, as Python dicts do.
  // Throws jambo::Error "chat template: ..." for a request or a template that cannot render (a
  // 400 for the client), including the template's own raise_exception() messages.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string source, chat_template::Template program, chat_template::Dict special_tokens)
      : source_(std::move(source)), program_(std::move(program)), special_tokens_(std::move(special_tokens)) {}

  std::string source_;
  chat_template::Template program_;
  chat_template::Dict special_tokens_;  // only the tokens the tokenizer defines, as in transformers
};

}  // namespace jambo::chat_template
