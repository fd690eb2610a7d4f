#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/hf/json_reader.hpp"

/// tokenizer.json's `model` of type BPE, with the semantics of HF tokenizers: merges applied by
/// rank (lowest first, leftmost first among equal ranks), `byte_fallback` (`<0xNN>` tokens for
/// characters missing from the vocabulary), `unk_token` with `fuse_unk`, `ignore_merges` (a word
/// found whole in the vocabulary is one token), `continuing_subword_prefix`, `end_of_word_suffix`.
/// Merges may be written as "a b" strings or as ["a", "b"] pairs. Other model types (WordPiece,
/// Unigram, WordLevel) and a non-zero `dropout` (random encodings) are refused.
namespace rlforge::text::hf {

/// A BPE model. Immutable once built; every method is safe to call from many threads at once
/// (short words' results are memoized per thread, see word_cache.hpp).
class bpe_model {
public:
  /// Builds the model of object `j` (at JSON path `where`). Throws `tokenizer_error` for an
  /// unsupported type, a malformed vocabulary or merge list, a merge whose parts or result are not
  /// in the vocabulary, or an `unk_token` missing from it.
  static std::unique_ptr<const bpe_model> from_json(const json& j, const std::string& where);

  /// Appends the ids of `word`, written in the model's alphabet (for a byte-level model: GPT-2's
  /// byte characters).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  /// Whether `tokenize_raw` may be used: every one of the 256 byte characters is in the
  /// vocabulary and there is no subword prefix or end-of-word suffix.
  bool reads_raw_bytes() const noexcept { return reads_raw_bytes_; }

  /// `tokenize` of the byte-level spelling of `raw`, without building that spelling: gives the
  /// same ids as `tokenize(byte_level(raw))`. Only when `reads_raw_bytes()`.
  void tokenize_raw(std::string_view raw, std::vector<int32_t>& out) const;

  /// The id of `token` in the model's vocabulary.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// The token of `id`, or nullptr when no token has it.
  const std::string* id_to_token(int32_t id) const noexcept;

  /// One more than the largest id of the vocabulary.
  int32_t id_bound() const noexcept { return static_cast<int32_t>(tokens_.size()); }

private:
  struct merge {
    int32_t rank;
    int32_t new_id;
  };

  // Open addressing over (left id, right id) pairs: merges are looked up for every adjacent pair
  // of every word, so this map is the hot path of encoding.
  class pair_map {
  public:
    void reserve(size_t n);
    void insert(int32_t a, int32_t b, merge m);
    const merge* find(int32_t a, int32_t b) const noexcept;

  private:
    struct slot {
      uint64_t key;
      merge value;
    };
    static constexpr uint64_t empty = ~uint64_t{0};
    std::vector<slot> slots_;
    uint64_t mask_ = 0;
    size_t size_ = 0;
  };

  bpe_model() = default;
  int32_t char_id(std::string_view s, bool first, bool last, std::string& scratch) const;
  void tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void tokenize_raw_uncached(std::string_view raw, std::vector<int32_t>& out) const;
  void merge_symbols(std::vector<int32_t>& symbols) const;
  void merge_symbols_heap(std::vector<int32_t>& symbols) const;

  // Tokens by id; the maps below view these strings (never modified once built), so lookups
  // take a string_view without allocating.
  std::vector<std::string> tokens_;
  std::unordered_map<std::string_view, int32_t> vocab_;
  std::vector<bool> assigned_;
  pair_map merges_;
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  std::string prefix_;
  std::string suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Ids of single characters below U+10000 (-1 when absent), valid when there is no prefix or
  // suffix; ids of the `<0xNN>` byte tokens; ids of GPT-2's 256 byte characters.
  std::vector<int32_t> bmp_ids_;
  std::array<int32_t, 256> fallback_ids_{};
  std::array<int32_t, 256> byte_char_ids_{};
  bool reads_raw_bytes_ = false;
  // This model's key in the per-thread word caches (see word_cache.hpp).
  uint64_t cache_id_ = 0;
  // For ignore_merges with raw bytes: vocabulary tokens spelled in raw bytes.
  std::deque<std::string> raw_spellings_;
  std::unordered_map<std::string_view, int32_t> raw_vocab_;
};

} // namespace rlforge::text::hf
