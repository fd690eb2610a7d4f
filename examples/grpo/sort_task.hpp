#pragma once
// The GRPO job's long-response task (--task sort): sort a list of distinct numbers in 0..99
// ("<bos>37,5,82=" -> "5,37,82<eos>", one token per number and per ','). Lists have 12-80
// numbers by default, drawn with a heavy tail (most are short, some long), so answers take
// 24-160 tokens and one step's longest answer is several times its mean: the regime of
// reasoning RL, where generation is a large share of a step. The reward is exact, with partial
// credit for each leading number in place; held-out accuracy is the share of numbers in place.
// Plain C++: no torch, no CAF.
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "examples/grpo/number_list.hpp"
#include "examples/grpo/verifiable_task.hpp"

namespace rlforge::examples::sorting {

/// The task's tokenizer (number_list.hpp): one id per number in 0..99, ',' and '='.
using tokenizer = grpo::number_tokenizer;

/// What the task generates.
struct task_config {
  int min_numbers = 12;       ///< shortest list, >= 2
  int max_numbers = 80;       ///< longest list, min_numbers..100
  int held_out = 200;         ///< held-out lists, 1..100000
  uint64_t seed = 1;          ///< determines the held-out set
  /// The reward of an answer that is not exact: this times the share of the sorted list's
  /// numbers it states in place before its first mistake, in [0, 1).
  double partial_credit = 0.5;
};

/// The list distribution, split into a fixed held-out set and the training lists (all others).
/// A list's length is `grpo::heavy_tailed_length(rng, min_numbers, max_numbers)` (median about an
/// eighth of the way up, a tail to the longest); its numbers are distinct, a uniform draw from
/// 0..99 in random order.
class task final : public grpo::verifiable_task {
public:
  /// Draws the held-out set from `cfg.seed`. Throws std::invalid_argument naming the field and
  /// value for a configuration outside the ranges of `task_config`.
  explicit task(task_config cfg);

  const task_config& config() const { return cfg_; }

  /// A list of the training distribution (never a held-out one).
  std::vector<int> sample_train(std::mt19937_64& rng) const;

  /// True when `list` is in the held-out set.
  bool is_held_out(const std::vector<int>& list) const { return held_out_set_.count(list) > 0; }

  // verifiable_task
  std::string description() const override;
  int64_t vocab_size() const override { return tokenizer::vocab_size(); }
  int64_t eos_id() const override { return tokenizer::eos_id; }
  int64_t context() const override;
  int64_t max_answer_tokens() const override;
  std::vector<int64_t> sample_prompt(std::mt19937_64& rng) const override;
  std::vector<std::vector<int64_t>> held_out_prompts() const override;
  std::vector<int64_t> target(const std::vector<int64_t>& prompt) const override;
  double reward(const std::vector<int64_t>& prompt,
                const std::vector<int64_t>& response) const override;
  /// The share of the sorted list's numbers `response` has in place before its first mistake
  /// (1 for the exact answer): exact answers to long lists are rare for a tiny model.
  double accuracy(const std::vector<int64_t>& prompt,
                  const std::vector<int64_t>& response) const override;
  double required_gain() const override { return 0.10; }

private:
  std::vector<int> draw(std::mt19937_64& rng) const;

  task_config cfg_;
  std::vector<std::vector<int>> held_out_;
  std::set<std::vector<int>> held_out_set_;
};

/// `<bos>`, the numbers separated by ',', then '='. Throws std::invalid_argument for a number
/// outside 0..99.
std::vector<int64_t> prompt_tokens(const std::vector<int>& list);

/// The sorted numbers separated by ',', then `<eos>`.
std::vector<int64_t> target_tokens(const std::vector<int>& list);

/// The list `ids` states (the inverse of `prompt_tokens`). Throws std::invalid_argument saying
/// what is wrong for anything else.
std::vector<int> parse_prompt(const std::vector<int64_t>& ids);

/// How many of the sorted list's numbers `response` states in place before its first mistake
/// (a number counts with the ',' after it; the last with the `<eos>` that ends the response).
/// All of them exactly when `response` is the target. Any ids are accepted.
int64_t numbers_in_place(const std::vector<int>& list, const std::vector<int64_t>& response);

} // namespace rlforge::examples::sorting
