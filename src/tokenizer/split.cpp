#include "tokenizer/split.h"

#include "tokenizer/unicode.h"

namespace jambo::tokenizer {
namespace {

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// The whole text as alternating non-match / match spans.
std::vector<Span> cover_text(size_t text_size, const std::vector<ByteRange>& matches, bool invert) {
  std::vector<Span> spans;
  size_t pos = 0;
  for (const ByteRange& match : matches) {
    if (pos < match.begin) spans.push_back({pos, match.begin, invert});
    spans.push_back({match.begin, match.end, !invert});
    pos = match.end;
  }
  if (pos < text_size) spans.push_back({pos, text_size, invert});
  return spans;
}

// Each fold below mirrors the one in HF's NormalizedString::split for the same behaviour.
std::vector<Span> merge_with_previous(const std::vector<Span>& spans) {
  std::vector<Span> out;
  bool previous_match = false;
  for (const Span& span : spans) {
    if (span.is_match && !previous_match && !out.empty()) {
      out.back().end = span.end;
    } else {
      out.push_back(span);
    }
    previous_match = span.is_match;
  }
  return out;
}

std::vector<Span> merge_with_next(const std::vector<Span>& spans) {
  std::vector<Span> reversed;
  bool previous_match = false;
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    if (it->is_match && !previous_match && !reversed.empty()) {
      reversed.back().begin = it->begin;
    } else {
      reversed.push_back(*it);
    }
    previous_match = it->is_match;
  }
  return {reversed.rbegin(), reversed.rend()};
}

std::vector<Span> merge_contiguous(const std::vector<Span>& spans) {
  std::vector<Span> out;
  bool previous_match = false;
  for (const Span& span : spans) {
    if (span.is_match == previous_match && !out.empty()) {
      out.back().end = span.end;
    } else {
      out.push_back(span);
    }
    previous_match = span.is_match;
  }
  return out;
}

// Matches of the GPT-2 pattern at one position: the length in characters of the first
// alternative that matches at chars[i] (each alternative is tried in the pattern's order).
class Gpt2Matcher {
 public:
  explicit Gpt2Matcher(const std::vector<unicode::CharSpan>& chars) : chars_(chars) {}

  size_t match_at(size_t i) const {
    if (size_t n = match_contraction(i)) return n;
    if (size_t n = match_run_after_optional_space(i, unicode::is_letter)) return n;
    if (size_t n = match_run_after_optional_space(i, unicode::is_number)) return n;
    if (size_t n = match_run_after_optional_space(i, is_other)) return n;
    return match_whitespace(i);
  }

 private:
  static bool is_other(char32_t c) {
    return !unicode::is_whitespace(c) && !unicode::is_letter(c) && !unicode::is_number(c);
  }
  char32_t at(size_t i) const { return i < chars_.size() ? chars_[i].code_point : 0; }

  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
  size_t match_contraction(size_t i) const {
    if (at(i) != U'\'') return 0;
    const char32_t first = at(i + 1), second = at(i + 2);
    if (first == U's' || first == U't' || first == U'm' || first == U'd') return 2;
    if ((first == U'r' || first == U'v') && second == U'e') return 3;
    if (first == U'l' && second == U'l') return 3;
    return 0;
  }

  //  ?X+ : an optional space, then one or more characters of class X.
  template <typename Predicate>
  size_t match_run_after_optional_space(size_t i, Predicate in_class) const {
    size_t j = i < chars_.size() && at(i) == U' ' ? i + 1 : i;
    if (j >= chars_.size() || !in_class(at(j))) return 0;
    while (j < chars_.size() && in_class(at(j))) ++j;
    return j - i;
  }

  // \s+(?!\S) backtracks to leave the last white space before a non-space for the next word;
  // a single white space before a non-space falls through to \s+.
  size_t match_whitespace(size_t i) const {
    size_t end = i;
    while (end < chars_.size() && unicode::is_whitespace(at(end))) ++end;
    const size_t run = end - i;
    if (run == 0) return 0;
    if (end == chars_.size() || run == 1) return run;
    return run - 1;
  }

  const std::vector<unicode::CharSpan>& chars_;
};

}  // namespace

std::vector<std::string> split_at_matches(std::string_view text,
                                          const std::vector<ByteRange>& matches,
                                          SplitBehavior behavior, bool invert) {
  std::vector<Span> spans = cover_text(text.size(), matches, invert);
  switch (behavior) {
    case SplitBehavior::kRemoved:
      std::erase_if(spans, [](const Span& span) { return span.is_match; });
      break;
    case SplitBehavior::kIsolated:
      break;
    case SplitBehavior::kMergedWithPrevious:
      spans = merge_with_previous(spans);
      break;
    case SplitBehavior::kMergedWithNext:
      spans = merge_with_next(spans);
      break;
    case SplitBehavior::kContiguous:
      spans = merge_contiguous(spans);
      break;
  }
  std::vector<std::string> pieces;
  for (const Span& span : spans) {
    if (span.end > span.begin) pieces.emplace_back(text.substr(span.begin, span.end - span.begin));
  }
  return pieces;
}

std::vector<ByteRange> find_literal(std::string_view text, std::string_view literal) {
  std::vector<ByteRange> matches;
  if (literal.empty()) return matches;
  for (size_t pos = text.find(literal); pos != std::string_view::npos;
       pos = text.find(literal, pos + literal.size())) {
    matches.push_back({pos, pos + literal.size()});
  }
  return matches;
}

std::string replace_all(std::string_view text, std::string_view literal, std::string_view content) {
  std::string out;
  size_t pos = 0;
  for (const ByteRange& match : find_literal(text, literal)) {
    out.append(text.substr(pos, match.begin - pos));
    out.append(content);
    pos = match.end;
  }
  out.append(text.substr(pos));
  return out;
}

std::vector<ByteRange> find_gpt2_words(std::string_view text) {
  const std::vector<unicode::CharSpan> chars = unicode::split_chars(text);
  const Gpt2Matcher matcher(chars);
  std::vector<ByteRange> matches;
  for (size_t i = 0; i < chars.size();) {
    const size_t num_chars = matcher.match_at(i);
    if (num_chars == 0) {  // cannot happen: every character is \s, \p{L}, \p{N} or neither
      ++i;
      continue;
    }
    matches.push_back({chars[i].begin, chars[i + num_chars - 1].end});
    i += num_chars;
  }
  return matches;
}

}  // namespace jambo::tokenizer
