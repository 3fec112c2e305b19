#include "tokenizer/bpe.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace jambo::tokenizer {

BpeModel::BpeModel(const JsonField& model, int64_t id_limit) : file_(model.file()) {
  if (auto dropout = model.find("dropout"); dropout && dropout->as_number() != 0.0) {
    dropout->fail("BPE dropout is not supported (inference needs deterministic merges)");
  }
  if (auto unk = model.find("unk_token")) unk_token_ = unk->as_string();
  continuing_subword_prefix_ = model.string_or("continuing_subword_prefix", "");
  end_of_word_suffix_ = model.string_or("end_of_word_suffix", "");
  fuse_unk_ = model.bool_or("fuse_unk", false);
  byte_fallback_ = model.bool_or("byte_fallback", false);
  ignore_merges_ = model.bool_or("ignore_merges", false);
  read_vocab(model.at("vocab"), id_limit);
  read_merges(model.at("merges"));
  for (int byte = 0; byte < 256; ++byte)
    byte_ids_[byte] = token_to_id(fmt::format("<0x{:02X}>", byte));
}

void BpeModel::read_vocab(const JsonField& vocab, int64_t id_limit) {
  if (!vocab.json().is_object()) vocab.fail("expected an object mapping tokens to ids");
  for (const auto& [token, id_json] : vocab.json().items()) {
    const int32_t id = JsonField(id_json, file_, "model.vocab[\"" + token + "\"]").as_token_id(token, id_limit);
    ids_by_token_[token] = id;
    if (static_cast<size_t>(id) >= tokens_by_id_.size()) tokens_by_id_.resize(id + 1);
    tokens_by_id_[id] = token;
  }
}

// Merges come as "left right" strings (older files) or ["left", "right"] pairs. As in HF, a pair
// listed twice keeps the rank of its last occurrence.
void BpeModel::read_merges(const JsonField& merges) {
  const size_t num_merges = merges.size();
  merges_.reserve(num_merges);
  for (size_t rank = 0; rank < num_merges; ++rank) {
    const JsonField entry = merges.at(rank);
    std::string left, right;
    if (entry.json().is_string()) {
      const std::string text = entry.as_string();
      const size_t space = text.find(' ');
      if (space == std::string::npos) entry.fail("expected a merge \"left right\"");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (entry.json().is_array() && entry.size() == 2) {
      left = entry.at(0).as_string();
      right = entry.at(1).as_string();
    } else {
      entry.fail("expected a merge \"left right\" or [\"left\", \"right\"]");
    }
    const auto left_id = token_to_id(left);
    const auto right_id = token_to_id(right);
    const std::string merged =
        left + right.substr(std::min(continuing_subword_prefix_.size(), right.size()));
    const auto merged_id = token_to_id(merged);
    if (!left_id || !right_id || !merged_id) {
      entry.fail(fmt::format("merge token '{}' is not in model.vocab", !left_id    ? left
                                                                       : !right_id ? right
                                                                                   : merged));
    }
    merges_[pair_key(*left_id, *right_id)] = {static_cast<uint32_t>(rank), *merged_id};
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = ids_by_token_.find(std::string(token));
  if (it == ids_by_token_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_by_id_.size() || !tokens_by_id_[id])
    return nullptr;
  return &*tokens_by_id_[id];
}

int32_t BpeModel::unk_id() const {
  auto id = token_to_id(*unk_token_);
  JAMBO_REQUIRE(id, "{}: model.unk_token '{}' is not in model.vocab", file_, *unk_token_);
  return *id;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// One symbol per character; an unknown character becomes its <0xNN> byte tokens (byte_fallback),
// else the unk token, else it is dropped. As in HF, an unk waits until the next known character or
// the end of the word (so byte tokens may overtake it), and fuse_unk folds consecutive unks.
std::vector<BpeModel::Symbol> BpeModel::initial_symbols(std::string_view word) const {
  std::vector<int32_t> ids;
  bool unk_pending = false;
  const auto chars = unicode::split_chars(word);
  for (size_t i = 0; i < chars.size(); ++i) {
    const std::string symbol =
        (i > 0 ? continuing_subword_prefix_ : "") +
        std::string(word.substr(chars[i].begin, chars[i].end - chars[i].begin)) +
        (i + 1 == chars.size() ? end_of_word_suffix_ : "");
    if (auto id = token_to_id(symbol)) {
      if (unk_pending) ids.push_back(unk_id());
      unk_pending = false;
      ids.push_back(*id);
      continue;
    }
    if (byte_fallback_ && has_all_byte_tokens(symbol)) {
      for (unsigned char byte : symbol) ids.push_back(*byte_ids_[byte]);
      continue;
    }
    if (!unk_token_) continue;
    if (unk_pending && !fuse_unk_) ids.push_back(unk_id());
    unk_pending = true;
  }
  if (unk_pending) ids.push_back(unk_id());

  std::vector<Symbol> symbols(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    symbols[i] = {ids[i], static_cast<int32_t>(i) - 1,
                  i + 1 < ids.size() ? static_cast<int32_t>(i + 1) : -1, false};
  }
  return symbols;
}

bool BpeModel::has_all_byte_tokens(std::string_view text) const {
  for (unsigned char byte : text) {
    if (!byte_ids_[byte]) return false;
  }
  return true;
}

// HF's Word::merge_all: a min-heap of candidate merges ordered by (rank, position). Entries made
// stale by an earlier merge are recognised and skipped when popped. O(n log n) in the word length.
void BpeModel::merge_all(std::vector<Symbol>& symbols) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_candidate = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* merge = find_merge(symbols[pos].id, symbols[next].id)) {
      queue.push({merge->rank, pos, merge->merged_id});
    }
  };
  for (size_t pos = 0; pos + 1 < symbols.size(); ++pos) push_candidate(static_cast<int32_t>(pos));

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = find_merge(left.id, right.id);
    if (!current || current->merged_id != top.merged_id) continue;  // stale entry

    left.id = top.merged_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(top.pos);
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols = initial_symbols(word);
  merge_all(symbols);
  for (const Symbol& symbol : symbols) {
    if (!symbol.removed) ids.push_back(symbol.id);
  }
}

}  // namespace jambo::tokenizer
