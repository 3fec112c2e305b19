// A Jinja2 subset interpreter, good for Hugging Face chat templates: parse once, render many times,
// with bounds so that a hostile template or request can neither crash the server nor run forever.
#pragma once

#include "chat_template/jinja_value.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace jambo::chat_template {

struct RenderLimits {
  size_t max_output_bytes = 16 << 20;
  // All text and list items built while rendering (macro output, concatenations, filters).
  size_t max_built_bytes = 256 << 20;
  uint64_t max_steps = 10'000'000;  // expressions evaluated plus loop iterations
  int max_call_depth = 64;          // nested macro calls
};

class Template {
 public:
  // Throws jambo::Error "line L, column C: ..." naming what was expected.
  static Template parse(std::string_view source);

  // Renders with these variables on top of the global functions. Throws jambo::Error: the
  // template's own message for raise_exception(), "line L: ..." for any other failure.
  std::string render(const Dict& variables, const RenderLimits& limits = {}) const;

  struct Program;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace jambo::chat_template
