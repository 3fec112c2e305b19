// ChatTemplate: loading a model folder's template, and rendering the real templates of the demo
// model and of AI21's Jamba models (tests/chat_template/data/README.md says where each came from) as
// transformers' apply_chat_template does. Python is not available here, so every expected render is
// worked out by hand from the template text and jinja2's whitespace rules (trim_blocks: a block
// tag's own newline goes; lstrip_blocks: the indentation before a block tag goes; '-' eats all
// whitespace on its side; variable tags keep what surrounds them); the comments give the steps.
#include "chat_template/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "jinja_test_util.h"

namespace jambo::chat_template {
namespace {

using json = nlohmann::ordered_json;

std::filesystem::path source_dir() { return JAMBO_SOURCE_DIR; }

std::string read_data(const std::string& name) {
  std::ifstream stream(source_dir() / "tests/chat_template/data" / name, std::ios::binary);
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

ChatTemplate jamba_mini() {
  return ChatTemplate::parse(read_data("jamba-mini-1.7.jinja"), "<|startoftext|>", "<|endoftext|>");
}
ChatTemplate jamba_reasoning() {
  return ChatTemplate::parse(read_data("jamba-reasoning-3b.jinja"), "<|startoftext|>", "<|im_end|>");
}

std::filesystem::path write_model_folder(const std::string& name, const json& config) {
  const auto folder = std::filesystem::temp_directory_path() / ("jambo-chat-template-test-" + name);
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "tokenizer_config.json") << config.dump();
  return folder;
}

const json kSystemAndUser = json::array(
    {{{"role", "system"}, {"content", "You are a helpful assistant."}}, {{"role", "user"}, {"content", "Hello"}}});

// ---- the demo model: {{ bos_token }}, then <|bom|><|role|> content<|eom|> per message

TEST(DemoTemplate, RendersEachMessageAndTheGenerationPrompt) {
  const ChatTemplate chat = ChatTemplate::load(source_dir() / "models/jambo-demo");
  EXPECT_EQ(chat.render(kSystemAndUser, true),
            "<|startoftext|><|bom|><|system|> You are a helpful assistant.<|eom|><|bom|><|user|> Hello<|eom|>"
            "<|bom|><|assistant|>");
  EXPECT_EQ(chat.render(kSystemAndUser, false),
            "<|startoftext|><|bom|><|system|> You are a helpful assistant.<|eom|><|bom|><|user|> Hello<|eom|>");
}

TEST(DemoTemplate, TextPartsAreJoinedWithNewlines) {
  const ChatTemplate chat = ChatTemplate::load(source_dir() / "models/jambo-demo");
  const json messages = json::array(
      {{{"role", "user"},
        {"content", json::array({{{"type", "text"}, {"text", "Hello"}}, {{"type", "text"}, {"text", "world"}}})}}});
  EXPECT_EQ(chat.render(messages, true), "<|startoftext|><|bom|><|user|> Hello\nworld<|eom|><|bom|><|assistant|>");
}

// ---- Jamba Mini 1.7 (the Jamba 1.5 family's template)

TEST(JambaTemplate, SystemAndUser) {
  // bos_token; handle_first_system_message: <|bom|> + handle_role("system") ("<|system|> ") + the
  // system text; each later message closes the previous one with <|eom|>; the generation prompt is
  // <|eom|><|bom|> + handle_role("assistant", add_space=False).
  EXPECT_EQ(jamba_mini().render(kSystemAndUser, true),
            "<|startoftext|><|bom|><|system|> You are a helpful assistant.<|eom|><|bom|><|user|> Hello<|eom|>"
            "<|bom|><|assistant|>");
}

TEST(JambaTemplate, WithoutSystemMessageTheDefaultEmptyOneIsStillWritten) {
  // system_message falls back to default_system_message, "": defined and not none, so the system
  // turn is written with an empty text. (Other sources agree: llama.cpp-based tools and VLMEvalKit
  // list Jamba's prompt as "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|user|> ...".)
  const std::string expected = "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|user|> Hi<|eom|><|bom|><|assistant|>";
  EXPECT_EQ(jamba_mini().render(json::array({{{"role", "user"}, {"content", "Hi"}}}), true), expected);
  // An empty system prompt renders the same.
  EXPECT_EQ(jamba_mini().render(
                json::array({{{"role", "system"}, {"content", ""}}, {{"role", "user"}, {"content", "Hi"}}}), true),
            expected);
}

TEST(JambaTemplate, MultiTurnWithoutGenerationPrompt) {
  // Without add_generation_prompt the else branch closes the last message with <|eom|>.
  const json messages = json::array({{{"role", "system"}, {"content", "S"}},
                                     {{"role", "user"}, {"content", "U1"}},
                                     {{"role", "assistant"}, {"content", "A1"}},
                                     {{"role", "user"}, {"content", "U2"}},
                                     {{"role", "assistant"}, {"content", "A2"}}});
  EXPECT_EQ(jamba_mini().render(messages, false),
            "<|startoftext|><|bom|><|system|> S<|eom|><|bom|><|user|> U1<|eom|><|bom|><|assistant|> A1<|eom|>"
            "<|bom|><|user|> U2<|eom|><|bom|><|assistant|> A2<|eom|>");
}

TEST(JambaTemplate, TextPartsAndNames) {
  // A message's name follows its role: handle_role(role) + "(" + name + ")".
  const json messages =
      json::array({{{"role", "user"},
                    {"name", "Bob"},
                    {"content", json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})}}});
  EXPECT_EQ(jamba_mini().render(messages, true),
            "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|user|> (Bob)a\nb<|eom|><|bom|><|assistant|>");
}

TEST(JambaTemplate, ToolDefinitionsToolCallsAndToolResults) {
  // The tool list goes into the first system message after "\n\n", each function as
  // tojson(indent=2). A tool call is written by a variable tag that lstrip_blocks does not touch,
  // so its four spaces of indentation stay, and the "," between calls keeps the newline after it.
  // The assistant's null content is "" after its role's space.
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "get_weather"},
                                     {"description", "Get the weather"},
                                     {"parameters",
                                      {{"type", "object"},
                                       {"properties", {{"city", {{"type", "string"}}}}},
                                       {"required", json::array({"city"})}}}}}}});
  const json messages = json::array(
      {{{"role", "system"}, {"content", "S"}},
       {{"role", "user"}, {"content", "Weather in Paris and Rome?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls",
         json::array(
             {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}},
              {{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Rome"}}}}}}})}},
       {{"role", "tool"}, {"content", "{\"temp\": 20}"}}});
  EXPECT_EQ(
      jamba_mini().render(messages, true, {{"tools", tools}}),
      "<|startoftext|><|bom|><|system|> S\n\n<tool_definitions>\n# Tools\n\n## Functions\n\n"
      "{\n  \"name\": \"get_weather\",\n  \"description\": \"Get the weather\",\n  \"parameters\": {\n"
      "    \"type\": \"object\",\n    \"properties\": {\n      \"city\": {\n        \"type\": \"string\"\n"
      "      }\n    },\n    \"required\": [\n      \"city\"\n    ]\n  }\n}\n</tool_definitions><|eom|>"
      "<|bom|><|user|> Weather in Paris and Rome?<|eom|>"
      "<|bom|><|assistant|> <tool_calls>[\n    {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}},\n"
      "    {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n]</tool_calls><|eom|>"
      "<|bom|><|tool|> {\"temp\": 20}<|eom|><|bom|><|assistant|>");
}

TEST(JambaTemplate, DocumentsGoInASystemMessageBeforeTheLastUserTurn) {
  // handle_documents: every key but title and text becomes "Key: value" (key|title), in order.
  const json documents = json::array({{{"title", "Doc A"}, {"text", "Alpha."}, {"source", "wiki"}}});
  const json messages = json::array({{{"role", "user"}, {"content", "Q"}}});
  EXPECT_EQ(jamba_mini().render(messages, true, {{"documents", documents}}),
            "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|system|> <documents>\n# Documents\n\n"
            "You can use the following documents for reference:\n\n## Document ID: 0\nTitle: Doc A\nSource: wiki\n"
            "Text: Alpha.\n</documents><|eom|><|bom|><|user|> Q<|eom|><|bom|><|assistant|>");
}

TEST(JambaTemplate, KnobsAndCitations) {
  // knobs.is_set adds the active-modes system message; an assistant's citations are written as
  // the Python list of their document ids.
  const json knobs = {{"is_set", true}, {"citation_mode", "fast"}, {"response_format", "json_object"}};
  const json messages = json::array({{{"role", "user"}, {"content", "Q"}},
                                     {{"role", "assistant"},
                                      {"content", "A"},
                                      {"citations", json::array({{{"document_id", 0}}, {{"document_id", 2}}})}}});
  EXPECT_EQ(jamba_mini().render(messages, false, {{"knobs", knobs}}),
            "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|system|> <active_output_modes>\n# Active Modes\n\n"
            "The following modes configure the format or style of your responses. You should adhere to all currently"
            " active modes simultaneously.\n\n## Citation Mode\n\nProvide a list of references only for the documents"
            " you base your response on. Format your response with the original answer followed by a citation section."
            " Use this template: `{answer}<citations>DOCUMENT_IDS</citations>`, where DOCUMENT_IDS are the relevant"
            " document numbers (e.g. [2, 5, 9]), or [] if the answer cannot be supported by the provided documents."
            "\n\n## JSON Mode\n\nProvide your response in JSON format. Adhere strictly to any schema given by the user."
            " If an appropriate JSON format exists, use it without modification.\n</active_output_modes><|eom|>"
            "<|bom|><|user|> Q<|eom|><|bom|><|assistant|> A<citations>[0, 2]</citations><|eom|>");
}

TEST(JambaTemplate, RaiseExceptionReachesTheClient) {
  const json tools = json::array({{{"type", "retrieval"}}});
  EXPECT_EQ(test::error_of([&] {
              jamba_mini().render(json::array({{{"role", "user"}, {"content", "Q"}}}), true, {{"tools", tools}});
            }),
            "chat template: Currently, the only supported tool type is `function`");
}

// ---- Jamba Reasoning 3B: ChatML with a thinking instruction

const std::string kThinking =
    "Begin by thinking about the reasoning process in the mind within <think> </think> tags and then proceed to give "
    "your response.\n";

TEST(JambaReasoningTemplate, SystemAndUser) {
  // The system message is written first and skipped in the loop (loop.first); the last user message
  // gets thinking_prefix; the generation prompt opens a <think> block.
  EXPECT_EQ(jamba_reasoning().render(kSystemAndUser, true),
            "<|startoftext|><|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" +
                kThinking + "Hello<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(jamba_reasoning().render(kSystemAndUser, false),
            "<|startoftext|><|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" +
                kThinking + "Hello<|im_end|>\n");
}

TEST(JambaReasoningTemplate, MultiTurn) {
  // Only the last user message gets the prefix: U1 is followed by an answer without <think>, and
  // A1 comes before the last query, so it is written as it is.
  const json messages = json::array({{{"role", "user"}, {"content", "U1"}},
                                     {{"role", "assistant"}, {"content", "A1"}},
                                     {{"role", "user"}, {"content", "U2"}}});
  EXPECT_EQ(jamba_reasoning().render(messages, true),
            "<|startoftext|><|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\n" +
                kThinking + "U2<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(JambaReasoningTemplate, ReasoningInTheLastAnswerIsRewritten) {
  // The answer after the last query keeps its reasoning, split at </think> and rewritten as
  // "<think>\nR\n</think>\n\nA"; the user message before an answer that starts with <think> gets the
  // prefix too.
  const json messages = json::array(
      {{{"role", "user"}, {"content", "U"}}, {{"role", "assistant"}, {"content", "<think>\nR\n</think>\n\nA"}}});
  EXPECT_EQ(jamba_reasoning().render(messages, false),
            "<|startoftext|><|im_start|>user\n" + kThinking +
                "U<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n");
}

TEST(JambaReasoningTemplate, ToolsToolCallsAndToolResponses) {
  // Tools make a system message of their own (tojson without indent); a call's arguments are
  // written with tojson; tool results are wrapped in <tool_response> inside a user turn.
  const json tools =
      json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
  const json messages =
      json::array({{{"role", "user"}, {"content", "U"}},
                   {{"role", "assistant"},
                    {"content", ""},
                    {"tool_calls", json::array({{{"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}})}},
                   {{"role", "tool"}, {"content", "42"}}});
  EXPECT_EQ(jamba_reasoning().render(messages, true, {{"tools", tools}}),
            "<|startoftext|><|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
            "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
            "<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n");
}

// ---- loading

TEST(ChatTemplateLoad, TakesTheDefaultOfANamedListAndTokenObjects) {
  const json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                       {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                      {{"name", "default"}, {"template", "D{{ bos_token }}"}}})}};
  EXPECT_EQ(ChatTemplate::load(write_model_folder("named", config)).render(json::array(), false), "D<s>");
}

TEST(ChatTemplateLoad, PrefersChatTemplateJinja) {
  const auto folder = write_model_folder("jinja-file", {{"chat_template", "from config"}});
  std::ofstream(folder / "chat_template.jinja") << "from file\n";
  EXPECT_EQ(ChatTemplate::load(folder).render(json::array(), false), "from file");
}

TEST(ChatTemplateLoad, ErrorsNameTheFile) {
  EXPECT_ERROR_CONTAINS(ChatTemplate::load(write_model_folder("none", {{"bos_token", "<s>"}})),
                        "tokenizer_config.json: no chat_template");
  EXPECT_ERROR_CONTAINS(ChatTemplate::load(write_model_folder(
                            "no-default", {{"chat_template", json::array({{{"name", "x"}, {"template", ""}}})}})),
                        "tokenizer_config.json: chat_template has no template named 'default'");
  EXPECT_ERROR_CONTAINS(ChatTemplate::load(write_model_folder("bad", {{"chat_template", "ok\n{% if %}"}})),
                        "tokenizer_config.json: chat template: line 2, column 7: expected an expression, found '%}'");
  EXPECT_ERROR_CONTAINS(ChatTemplate::load(std::filesystem::temp_directory_path() / "jambo-chat-template-test-missing"),
                        "tokenizer_config.json: no such file");
}

// ---- requests the server must turn into a 400

TEST(ChatTemplateRender, RejectsContentThatIsNotText) {
  const ChatTemplate chat = ChatTemplate::parse("{{ messages }}", "", "");
  EXPECT_ERROR_CONTAINS(
      chat.render(json::array({{{"role", "user"}, {"content", 5}}}), true),
      "chat template: messages[0].content must be a string, null or a list of text parts, not number");
  EXPECT_ERROR_CONTAINS(
      chat.render(json::array({{{"role", "user"},
                                {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                         {{"type", "image_url"}, {"image_url", "x"}}})}}}),
                  true),
      "chat template: messages[0].content[1] must be {\"type\": \"text\", \"text\": \"...\"}");
  EXPECT_ERROR_CONTAINS(chat.render(json::object(), true), "chat template: messages must be an array");
  EXPECT_ERROR_CONTAINS(chat.render(json::array({"hi"}), true), "chat template: messages[0] must be an object");
  EXPECT_ERROR_CONTAINS(chat.render(json::array(), true, {{"messages", 1}}), "'messages' cannot be an extra variable");
}

TEST(ChatTemplateRender, TemplateFailuresAreChatTemplateErrors) {
  // The reasoning template reads message.content as a string: null content is a type error there,
  // as it is in transformers.
  const json messages = json::array({{{"role", "assistant"}, {"content", nullptr}}});
  EXPECT_ERROR_CONTAINS(jamba_reasoning().render(messages, false),
                        "chat template: line 51: argument of type 'NoneType' is not iterable");
  EXPECT_ERROR_CONTAINS(
      ChatTemplate::parse("{{ messages[0].content.x.y }}", "", "").render(json::array({{{"role", "user"}}}), true),
      "chat template: line 1: 'dict object' has no attribute 'content'");
}

TEST(ChatTemplateRender, MessagesKeepTheirKeyOrder) {
  // Ordered JSON keeps a client's key order, which tojson and items() expose.
  const ChatTemplate chat = ChatTemplate::parse("{{ messages[0]|tojson }}", "", "");
  EXPECT_EQ(chat.render(json::array({{{"role", "user"}, {"content", "x"}, {"b", 1}, {"a", 2}}}), false),
            R"({"role": "user", "content": "x", "b": 1, "a": 2})");
}

}  // namespace
}  // namespace jambo::chat_template
