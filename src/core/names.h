// The spellings of an enum's values, one table each, for printing a value and parsing a flag or a field alike.
#pragma once

#include "core/error.h"

#include <fmt/ranges.h>

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jambo {

template <typename T, size_t N>
using Names = std::array<std::pair<std::string_view, T>, N>;

template <typename T, size_t N>
std::string_view name_of(const Names<T, N>& names, T value) {
  for (const auto& [name, named] : names)
    if (named == value) return name;
  fail_internal("internal error: a value without a name ({})", int(value));
}

template <typename T, size_t N>
std::vector<std::string_view> all_names(const Names<T, N>& names) {
  std::vector<std::string_view> spellings;
  for (const auto& entry : names) spellings.push_back(entry.first);
  return spellings;
}

// Throws jambo::Error naming `what`, the text and every valid spelling when the text is none of them.
template <typename T, size_t N>
T parse_named(const Names<T, N>& names, std::string_view what, const std::string& text) {
  for (const auto& [name, named] : names)
    if (name == text) return named;
  fail("{} '{}' is not one of {}", what, text, fmt::join(all_names(names), ", "));
}

}  // namespace jambo
