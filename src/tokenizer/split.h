// Cutting text at pattern matches, as HF's NormalizedString::split with its delimiter behaviours,
// the two patterns the pre-tokenizers use (a literal string and the GPT-2 word pattern), and
// literal replacement.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace jambo::tokenizer {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct ByteRange {
  size_t begin;
  size_t end;
};

// matches: sorted and non-overlapping. invert swaps matches and the text between them. Empty pieces
// are dropped.
std::vector<std::string> split_at_matches(std::string_view text,
                                          const std::vector<ByteRange>& matches,
                                          SplitBehavior behavior, bool invert);

// Non-overlapping occurrences of a non-empty literal, leftmost first.
std::vector<ByteRange> find_literal(std::string_view text, std::string_view literal);

// text with every occurrence of a non-empty literal replaced, leftmost first.
std::string replace_all(std::string_view text, std::string_view literal, std::string_view content);

// Matches of the GPT-2 pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as a backtracking regex engine finds them, left to right. text must be valid UTF-8.
std::vector<ByteRange> find_gpt2_words(std::string_view text);
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace jambo::tokenizer
