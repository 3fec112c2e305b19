// The BPE model of HF tokenizers: a word is split into characters (or <0xNN> byte tokens, or the
// unk token) and pairs are merged by rank, lowest rank first and leftmost on ties.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer_json.h"

namespace jambo::tokenizer {

class BpeModel {
 public:
  // model: the "model" object of tokenizer.json (type "BPE"); every id of its vocab is below id_limit.
  BpeModel(const JsonField& model, int64_t id_limit);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  int64_t max_id() const { return static_cast<int64_t>(tokens_by_id_.size()) - 1; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t merged_id;
  };
  // A symbol of the word being merged, in a doubly linked list over the initial symbols.
  struct Symbol {
    int32_t id;
    int32_t prev;  // -1: none
    int32_t next;  // -1: none
    bool removed;
  };

  void read_vocab(const JsonField& vocab, int64_t id_limit);
  void read_merges(const JsonField& merges);
  std::vector<Symbol> initial_symbols(std::string_view word) const;
  void merge_all(std::vector<Symbol>& symbols) const;
  const Merge* find_merge(int32_t left, int32_t right) const;
  bool has_all_byte_tokens(std::string_view text) const;
  int32_t unk_id() const;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  std::string file_;
  std::unordered_map<std::string, int32_t> ids_by_token_;
  std::vector<std::optional<std::string>> tokens_by_id_;  // empty for ids the vocab leaves out
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> byte_ids_[256];  // <0xNN> tokens, for byte_fallback
};

}  // namespace jambo::tokenizer
