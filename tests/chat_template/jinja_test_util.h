// Helpers for the Jinja tests: render a template from JSON variables, and catch the error text.
#pragma once

#include "core/error.h"
#include "chat_template/jinja_template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>

namespace jambo::test {

inline std::string render(std::string_view source,
                          const nlohmann::ordered_json& variables = nlohmann::ordered_json::object(),
                          const chat_template::RenderLimits& limits = {}) {
  chat_template::Dict dict;
  for (const auto& [name, value] : variables.items()) dict.set(name, chat_template::from_json(value));
  return chat_template::Template::parse(source).render(dict, limits);
}

// The message of the jambo::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_ERROR_CONTAINS(statement, text)                                        \
  do {                                                                                \
    const std::string message = ::jambo::test::error_of([&] { (void)(statement); });  \
    EXPECT_NE(message.find(text), std::string::npos) << "error: '" << message << "'"; \
  } while (0)

}  // namespace jambo::test
