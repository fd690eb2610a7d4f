#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

/// A per-thread memo of a BPE model's output for short words: words repeat (a few thousand make up
/// most of any text), and merging is the costly step of encoding. Like HF tokenizers' thread-local
/// BPE cache, it keeps the model itself immutable and lock-free.
namespace rlforge::text::hf {

/// A direct-mapped table from words to ids: a word goes to one slot chosen by its hash and
/// replaces whatever was there. Owned by one thread (see `for_model`).
class word_cache {
public:
  /// Words longer than this are not cached.
  static constexpr size_t max_word = 48;

  /// The ids stored for `word`, or nullptr.
  const std::vector<int32_t>* find(std::string_view word) const noexcept;

  /// Stores `ids` for `word` (of at most `max_word` bytes).
  void store(std::string_view word, const int32_t* ids, size_t n);

  /// The calling thread's cache for the model with unique id `model` (a thread keeps the caches
  /// of its last few models). Never shared between threads.
  static word_cache& for_model(uint64_t model);

  /// A process-wide unique id for a new model (ids are never reused, so a cache can never serve a
  /// model the output of another that lived at the same address).
  static uint64_t next_model_id() noexcept;

private:
  struct slot {
    std::string word;
    std::vector<int32_t> ids;
    bool used = false;
  };
  static constexpr size_t slots = 1 << 15;
  std::vector<slot> table_ = std::vector<slot>(slots);
};

} // namespace rlforge::text::hf
