#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {
namespace {

size_t previous_char_begin(std::string_view text, size_t pos) {
  size_t begin = pos - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return begin;
}

// The first character after pos / the last one before pos, or 0 at the ends.
char32_t char_after(std::string_view text, size_t pos) {
  return pos < text.size() ? unicode::decode_utf8(text, pos).code_point : 0;
}

char32_t char_before(std::string_view text, size_t pos) {
  return pos > 0 ? unicode::decode_utf8(text, previous_char_begin(text, pos)).code_point : 0;
}

// Where the run of white space that ends at pos begins, and where the one starting at pos ends.
size_t whitespace_run_begin(std::string_view text, size_t pos) {
  while (pos > 0 && unicode::is_whitespace(char_before(text, pos)))
    pos = previous_char_begin(text, pos);
  return pos;
}

size_t whitespace_run_end(std::string_view text, size_t pos) {
  while (pos < text.size() && unicode::is_whitespace(char_after(text, pos))) {
    pos += unicode::decode_utf8(text, pos).num_bytes;
  }
  return pos;
}

// single_word: the token must not touch a word character (\w) on either side.
bool is_single_word(std::string_view text, size_t begin, size_t end) {
  const bool free_before = begin == 0 || !unicode::is_word_char(char_before(text, begin));
  const bool free_after = end == text.size() || !unicode::is_word_char(char_after(text, end));
  return free_before && free_after;
}

}  // namespace

AddedVocabulary::AddedVocabulary(const JsonField& added_tokens, int64_t id_limit, const Normalizer& normalizer,
                                 const BpeModel& model) {
  // HF builds its matchers from the special tokens first, then the others, each in file order.
  std::vector<AddedToken> specials, others;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const JsonField entry = added_tokens.at(i);
    AddedToken token;
    token.content = entry.at("content").as_string();
    token.id = entry.at("id").as_token_id(token.content, id_limit);
    if (auto model_id = model.token_to_id(token.content)) token.id = *model_id;
    token.single_word = entry.bool_or("single_word", false);
    token.lstrip = entry.bool_or("lstrip", false);
    token.rstrip = entry.bool_or("rstrip", false);
    token.special = entry.bool_or("special", false);
    token.normalized = entry.bool_or("normalized", !token.special);
    if (token.content.empty()) continue;  // HF ignores empty added tokens
    (token.special ? specials : others).push_back(std::move(token));
  }
  for (AddedToken& token : specials) add(std::move(token), normalizer);
  for (AddedToken& token : others) add(std::move(token), normalizer);
}

void AddedVocabulary::Matcher::add(std::string pattern, size_t token_index) {
  if (pattern.empty()) return;
  auto& bucket = patterns_by_first_byte_[static_cast<unsigned char>(pattern[0])];
  // Longest first; among equally long patterns the earlier one wins, as in HF's automaton.
  auto position =
      std::upper_bound(bucket.begin(), bucket.end(), pattern.size(),
                       [](size_t size, const Pattern& other) { return size > other.text.size(); });
  bucket.insert(position, {std::move(pattern), token_index});
}

std::vector<AddedVocabulary::Matcher::Match> AddedVocabulary::Matcher::find_all(
    std::string_view text) const {
  std::vector<Match> matches;
  for (size_t pos = 0; pos < text.size();) {
    const Pattern* found = nullptr;
    for (const Pattern& pattern : patterns_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      if (text.substr(pos).starts_with(pattern.text)) {
        found = &pattern;
        break;
      }
    }
    if (!found) {
      ++pos;
      continue;
    }
    matches.push_back({pos, pos + found->text.size(), found->token_index});
    pos += found->text.size();
  }
  return matches;
}

// As HF's AddedVocabulary::find_matches: a single_word token that touches a word is skipped (the
// search does not look inside it again); lstrip/rstrip widen the token over adjacent white space.
std::vector<Segment> AddedVocabulary::Matcher::split(std::string_view text, bool at_text_start,
                                                     const std::vector<AddedToken>& tokens) const {
  std::vector<Segment> segments;
  auto add_segment = [&](size_t begin, size_t end, std::optional<int32_t> token_id) {
    segments.push_back(
        {std::string(text.substr(begin, end - begin)), token_id, at_text_start && begin == 0});
  };
  size_t done = 0;
  for (const Match& match : find_all(text)) {
    const AddedToken& token = tokens[match.token_index];
    if (token.single_word && !is_single_word(text, match.begin, match.end)) continue;
    size_t begin = match.begin, end = match.end;
    if (token.lstrip) begin = std::max(whitespace_run_begin(text, begin), done);
    if (token.rstrip) end = whitespace_run_end(text, end);
    if (done < begin) add_segment(done, begin, std::nullopt);
    add_segment(begin, end, token.id);
    done = end;
  }
  if (done < text.size()) add_segment(done, text.size(), std::nullopt);
  return segments;
}

void AddedVocabulary::add(AddedToken token, const Normalizer& normalizer) {
  if (index_by_content_.contains(token.content)) return;
  const size_t index = tokens_.size();
  if (token.normalized) {
    normalized_matcher_.add(normalizer.normalize(token.content), index);
  } else {
    raw_matcher_.add(token.content, index);
  }
  index_by_content_[token.content] = index;
  index_by_id_[token.id] = index;
  tokens_.push_back(std::move(token));
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::find(std::string_view content) const {
  auto it = index_by_content_.find(std::string(content));
  if (it == index_by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

int64_t AddedVocabulary::max_id() const {
  int64_t max_id = -1;
  for (const AddedToken& token : tokens_) max_id = std::max<int64_t>(max_id, token.id);
  return max_id;
}

}  // namespace jambo::tokenizer
