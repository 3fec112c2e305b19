// Errors: one exception type whose message names what was wrong, and check macros that add
// the source location only when the failure is ours (a bug), not the user's (bad input).
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

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace jambo

// Input validation: throws jambo::Error with the formatted message.
#define JAMBO_REQUIRE(cond, ...)            \
  do {                                      \
    if (!(cond)) ::jambo::fail(__VA_ARGS__); \
  } while (0)

// Internal invariant: a failure is a bug in jambo, so the message says where.
#define JAMBO_ASSERT(cond)                                                                     \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::jambo::fail("internal error at {}:{}: '{}' does not hold (please report this)", __FILE__, \
                    __LINE__, #cond);                                                          \
  } while (0)
