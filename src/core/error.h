// Errors: two exception types, one for bad input (the user's to fix) and one for a broken invariant (a bug in
// jambo), and check macros for each; only the second names the source location.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace jambo {

// Bad input or an unusable resource (file, tensor, field, option). The message is for the user.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A broken internal invariant: a bug in jambo, never the caller's input. Deliberately not an Error, so that code
// that turns bad input into a 400 or a skipped line lets it through (the server answers 500).
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_internal(fmt::format_string<Args...> format, Args&&... args) {
  throw InternalError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace jambo

// Input validation: throws jambo::Error with the formatted message.
#define JAMBO_REQUIRE(cond, ...)             \
  do {                                       \
    if (!(cond)) ::jambo::fail(__VA_ARGS__); \
  } while (0)

// Internal invariant: a failure is a bug in jambo, so the message says where.
#define JAMBO_ASSERT(cond)                                                                                           \
  do {                                                                                                               \
    if (!(cond))                                                                                                     \
      ::jambo::fail_internal("internal error at {}:{}: '{}' does not hold (please report this)", __FILE__, __LINE__, \
                             #cond);                                                                                 \
  } while (0)
