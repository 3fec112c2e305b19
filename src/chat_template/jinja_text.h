// Python's str operations on UTF-8 text: Python indexes, strips and splits by code point, and its
// whitespace is Unicode whitespace. Lowercasing is Unicode's; upper, title and capitalize map ASCII
// letters only (roles, keys and titles in the templates are ASCII).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jambo::chat_template::text {

// Byte offsets of each code point of s, and s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);
size_t code_point_count(std::string_view s);

bool is_space(char32_t code_point);  // Python's str.isspace()
// str.strip / lstrip / rstrip; chars, when given, is the set of code points to remove.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) and, without sep, the whitespace split.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& separator, int64_t max_split);
std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);    // first character upper, the rest lower
std::string title(std::string_view s);         // jinja2's title filter: words start at '-', ' ', '(' ...
std::string python_title(std::string_view s);  // str.title(): words start after any non-letter

std::string repr(std::string_view s);  // Python repr() of a str: 'it''s' -> "it's"
std::string json_quote(std::string_view s, bool ensure_ascii);

}  // namespace jambo::chat_template::text
