#include "chat_template/chat_template.h"

#include "core/error.h"
#include "core/json.h"

#include <fstream>
#include <sstream>

namespace jambo::chat_template {
namespace {

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return "";
}

chat_template::Dict special_tokens_of(const nlohmann::json& config) {
  chat_template::Dict tokens;
  for (const char* name :
       {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    const auto found = config.find(name);
    if (found == config.end()) continue;
    if (std::string text = token_text(*found); !text.empty())
      tokens.set(name, chat_template::Value::string(std::move(text)));
  }
  if (const auto found = config.find("additional_special_tokens"); found != config.end() && found->is_array()) {
    chat_template::List additional;
    for (const auto& token : *found) additional.push_back(chat_template::Value::string(token_text(token)));
    tokens.set("additional_special_tokens", chat_template::Value::list(std::move(additional)));
  }
  return tokens;
}

std::string template_from_config(const nlohmann::json& config, const std::filesystem::path& file) {
  const auto found = config.find("chat_template");
  JAMBO_REQUIRE(found != config.end() && !found->is_null(), "{}: no chat_template", file.string());
  if (found->is_string()) return found->get<std::string>();
  if (found->is_array()) {
    for (const auto& entry : *found)
      if (entry.is_object() && entry.value("name", nlohmann::json()) == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
    fail("{}: chat_template has no template named 'default'", file.string());
  }
  fail("{}: chat_template must be a string or a list of {{\"name\", \"template\"}}, not {}", file.string(),
       describe_json(*found));
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  JAMBO_REQUIRE(stream.good(), "{}: cannot open the file", path.string());
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

// OpenAI content parts become one string: text-only models have no other kind of part.
nlohmann::ordered_json content_text(const nlohmann::ordered_json& content, size_t index) {
  if (content.is_string() || content.is_null()) return content;
  JAMBO_REQUIRE(content.is_array(), "messages[{}].content must be a string, null or a list of text parts, not {}",
                index, content.type_name());
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const auto& part = content[k];
    const bool text_part = part.is_object() && part.contains("type") && part["type"] == "text" &&
                           part.contains("text") && part["text"].is_string();
    JAMBO_REQUIRE(text_part,
                  "messages[{}].content[{}] must be {{\"type\": \"text\", \"text\": \"...\"}}: this model "
                  "reads text only",
                  index, k);
    if (k > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

chat_template::Value messages_value(const nlohmann::ordered_json& messages) {
  JAMBO_REQUIRE(messages.is_array(), "messages must be an array");
  chat_template::List list;
  for (size_t i = 0; i < messages.size(); ++i) {
    JAMBO_REQUIRE(messages[i].is_object(), "messages[{}] must be an object", i);
    chat_template::Dict message;
    for (const auto& [key, value] : messages[i].items())
      message.set(
          key, key == "content" ? chat_template::from_json(content_text(value, i)) : chat_template::from_json(value));
    list.push_back(chat_template::Value::dict(std::move(message)));
  }
  return chat_template::Value::list(std::move(list));
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::filesystem::path& folder) {
  const std::filesystem::path config_path = folder / "tokenizer_config.json";
  const std::filesystem::path jinja_path = folder / "chat_template.jinja";
  const nlohmann::json config = read_json_file(config_path);
  std::error_code error;
  const bool separate_file = std::filesystem::is_regular_file(jinja_path, error);
  const std::filesystem::path& source_path = separate_file ? jinja_path : config_path;
  std::string source = separate_file ? read_text_file(jinja_path) : template_from_config(config, config_path);
  try {
    chat_template::Template program = chat_template::Template::parse(source);
    return ChatTemplate(std::move(source), std::move(program), special_tokens_of(config));
  } catch (const Error& parse_error) {
    fail("{}: chat template: {}", source_path.string(), parse_error.what());
  }
}

ChatTemplate ChatTemplate::parse(std::string source, std::string bos_token, std::string eos_token) {
  nlohmann::json config = nlohmann::json::object();
  config["bos_token"] = std::move(bos_token);
  config["eos_token"] = std::move(eos_token);
  try {
    chat_template::Template program = chat_template::Template::parse(source);
    return ChatTemplate(std::move(source), std::move(program), special_tokens_of(config));
  } catch (const Error& parse_error) {
    fail("chat template: {}", parse_error.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  try {
    JAMBO_REQUIRE(extra.is_object() || extra.is_null(), "the extra template variables must be an object");
    // What transformers passes: the special tokens, messages, tools and documents (None unless
    // given) and add_generation_prompt, then the caller's own variables.
    chat_template::Dict variables = special_tokens_;
    variables.set("messages", messages_value(messages));
    variables.set("tools", chat_template::Value::none());
    variables.set("documents", chat_template::Value::none());
    variables.set("add_generation_prompt", chat_template::Value::boolean(add_generation_prompt));
    if (extra.is_object()) {
      for (const auto& [name, value] : extra.items()) {
        JAMBO_REQUIRE(name != "messages" && name != "add_generation_prompt", "'{}' cannot be an extra variable", name);
        variables.set(name, chat_template::from_json(value));
      }
    }
    return program_.render(variables);
  } catch (const Error& error) {
    fail("chat template: {}", error.what());
  }
}

}  // namespace jambo::chat_template
