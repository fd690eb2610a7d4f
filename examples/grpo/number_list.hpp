#pragma once
// What the built-in tasks whose prompts and answers are lists of numbers share (sort_task.hpp,
// count_task.hpp): the tokenizer over the numbers 0..99, ',' and '=' (one token each), a list's
// prompt and answer tokens and reading a prompt back, the heavy-tailed draw of a list's length,
// and the partial credit of an answer (its numbers in place before its first mistake).
// Plain C++: no torch, no CAF. Every function is reentrant.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "examples/grpo/task_tokens.hpp"

namespace rlforge::examples::grpo {

/// Tokenizer over the numbers 0..99 (one token each), ',' and '=' and three special tokens.
///
/// Ids: 0 = padding, 1 = beginning of sequence, 2 = end of sequence, 3 = ',', 4 = '=',
/// 5..104 = the numbers 0..99. Stateless.
class number_tokenizer {
public:
  static constexpr int64_t pad_id = grpo::pad_id;
  static constexpr int64_t bos_id = grpo::bos_id;
  static constexpr int64_t eos_id = grpo::eos_id;
  static constexpr int64_t comma_id = 3;
  static constexpr int64_t equals_id = 4;
  static constexpr int64_t number0_id = 5;

  /// Number of token ids (105).
  static constexpr int64_t vocab_size() { return 105; }

  /// The ids of `text`: each run of digits is one number (0..99, no leading zero), ',' and '='
  /// one id each. Throws std::invalid_argument naming the first character outside the alphabet,
  /// or the number outside 0..99, and its position.
  static std::vector<int64_t> encode(const std::string& text);

  /// The text of `ids`: special tokens render as `<pad>`, `<bos>`, `<eos>`. Throws
  /// std::invalid_argument naming the first id outside [0, vocab_size()) and its position.
  static std::string decode(const std::vector<int64_t>& ids);
};

/// `<bos>`, the numbers separated by ',', then '='. Throws std::invalid_argument naming the first
/// number outside 0..99 and its position; `who` starts the message ("sort task").
std::vector<int64_t> number_prompt(const std::vector<int>& numbers, const char* who);

/// The numbers separated by ',', then `<eos>`. Throws like `number_prompt`.
std::vector<int64_t> number_answer(const std::vector<int>& numbers, const char* who);

/// The numbers of `ids` when it is a prompt `number_prompt` makes (the empty string), or why it
/// is not one ("it does not start with <bos>", "item 2 is not a number followed by ','", ...).
std::string read_number_prompt(const std::vector<int64_t>& ids, std::vector<int>& numbers);

/// `ids` as text for an error message: its decoding, or "(not text: why)".
std::string shown_ids(const std::vector<int64_t>& ids);

/// A length in [lo, hi]: lo + floor((hi - lo + 1) u^3) for u uniform in [0, 1), at most hi. The
/// median is about an eighth of the way up, with a tail to hi (most answers short, some long).
int heavy_tailed_length(std::mt19937_64& rng, int lo, int hi);

/// How many of the numbers of `answer` (a `number_answer`) `response` states in place before its
/// first mistake: a number counts with the ',' after it, the last with the `<eos>` that ends the
/// response. All of them exactly when `response` is `answer`. Any ids are accepted.
int64_t numbers_in_place(const std::vector<int64_t>& answer, const std::vector<int64_t>& response);

/// The reward of `response` when `answer` (a non-empty `number_answer`) is right: 1 for exactly
/// `answer`, else `partial_credit` times the share of its numbers in place (`numbers_in_place`).
double number_answer_reward(const std::vector<int64_t>& answer,
                            const std::vector<int64_t>& response, double partial_credit);

/// The share of the numbers of `answer` (a non-empty `number_answer`) that `response` has in
/// place: 1 exactly for `answer`.
double number_answer_accuracy(const std::vector<int64_t>& answer,
                              const std::vector<int64_t>& response);

} // namespace rlforge::examples::grpo
