#pragma once
// What the built-in tasks' tokenizers share (arith_task.hpp, sort_task.hpp): the ids of the three
// special tokens and decoding them, with the check of every id against the vocabulary. Plain C++.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rlforge::examples::grpo {

/// The special ids of every built-in task's tokenizer.
inline constexpr int64_t pad_id = 0; ///< padding
inline constexpr int64_t bos_id = 1; ///< beginning of sequence
inline constexpr int64_t eos_id = 2; ///< end of sequence

/// The text of `ids`: special tokens render as `<pad>`, `<bos>`, `<eos>`, every other id as
/// `text_of(id)`. Throws std::invalid_argument "<who>: id X at position I is outside the
/// vocabulary [0, vocab_size)" for the first id outside it. Reentrant.
std::string decode_ids(const std::vector<int64_t>& ids, int64_t vocab_size, const char* who,
                       const std::function<std::string(int64_t)>& text_of);

} // namespace rlforge::examples::grpo
