#pragma once
// The GRPO job's short-prompt, long-answer task (--task count): count from a number to another
// in steps of 1-3 ("<bos>3,2,12=" -> "3,5,7,9,11<eos>": from 3 in steps of 2 while at most 12),
// one token per number and per ','. The prompt is 7 tokens and the answer 24-200 by default,
// with a heavy tail of lengths: the shape of reasoning RL (a short question, a long written-out
// answer), where generation is the larger share of a step because a trained token of the
// prompt costs the trainer as much as one of the answer and the engine almost nothing. Each
// number follows from the one before it, so a tiny model learns the task from a warm start in
// minutes. The reward is exact, with partial credit for each leading number in place;
// held-out accuracy is the share of numbers in place. Plain C++: no torch, no CAF.
#include <array>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "examples/grpo/number_list.hpp"
#include "examples/grpo/verifiable_task.hpp"

namespace rlforge::examples::counting {

/// One problem: count from `from` in steps of `step` while at most `to`.
struct problem {
  int from = 0;
  int step = 1;
  int to = 0;
  auto key() const { return std::array<int, 3>{from, step, to}; }
  bool operator<(const problem& o) const { return key() < o.key(); }
  bool operator==(const problem& o) const { return key() == o.key(); }
};

/// What the task generates.
struct task_config {
  int min_numbers = 12;  ///< fewest numbers in an answer, >= 2
  int max_numbers = 100; ///< most numbers in an answer, min_numbers..100
  int max_step = 3;      ///< largest step, 1..9
  int held_out = 200;    ///< held-out problems, 1..(a quarter of all problems)
  uint64_t seed = 1;     ///< determines the held-out set
  /// The reward of an answer that is not exact: this times the share of the answer's numbers it
  /// states in place before its first mistake, in [0, 1).
  double partial_credit = 0.5;
};

/// The problem distribution, split into a fixed held-out set and the training problems (all
/// others). An answer's count of numbers n is `grpo::heavy_tailed_length(rng, min_numbers,
/// max_numbers)`; the step is uniform among those that fit n numbers into 0..99 (at most
/// max_step), the start uniform among those that fit, and the end uniform among those that give
/// exactly n numbers.
class task final : public grpo::verifiable_task {
public:
  /// Draws the held-out set from `cfg.seed`. Throws std::invalid_argument naming the field and
  /// value for a configuration outside the ranges of `task_config`.
  explicit task(task_config cfg);

  const task_config& config() const { return cfg_; }

  /// A problem of the training distribution (never a held-out one).
  problem sample_train(std::mt19937_64& rng) const;

  /// True when `p` is in the held-out set.
  bool is_held_out(const problem& p) const { return held_out_set_.count(p) > 0; }

  /// Problems whose answers have min_numbers..max_numbers numbers (what the held-out set may
  /// take at most a quarter of).
  int64_t problems() const { return problems_; }

  // verifiable_task
  std::string description() const override;
  int64_t vocab_size() const override { return grpo::number_tokenizer::vocab_size(); }
  int64_t eos_id() const override { return grpo::number_tokenizer::eos_id; }
  int64_t context() const override;
  int64_t max_answer_tokens() const override;
  std::vector<int64_t> sample_prompt(std::mt19937_64& rng) const override;
  std::vector<std::vector<int64_t>> held_out_prompts() const override;
  std::vector<int64_t> target(const std::vector<int64_t>& prompt) const override;
  double reward(const std::vector<int64_t>& prompt,
                const std::vector<int64_t>& response) const override;
  /// The share of the answer's numbers `response` has in place before its first mistake (1 for
  /// the exact answer).
  double accuracy(const std::vector<int64_t>& prompt,
                  const std::vector<int64_t>& response) const override;
  double required_gain() const override { return 0.10; }

private:
  problem draw(std::mt19937_64& rng) const;
  /// The problem `prompt` states, checked against this configuration's ranges.
  problem read(const std::vector<int64_t>& prompt) const;

  task_config cfg_;
  int64_t problems_ = 0;
  std::vector<problem> held_out_;
  std::set<problem> held_out_set_;
};

/// The numbers of `p`'s answer: from, from + step, ... while at most to. Throws
/// std::invalid_argument for a step below 1 or an end below the start.
std::vector<int> numbers_of(const problem& p);

/// `<bos>from,step,to=`. Throws std::invalid_argument for a number outside 0..99.
std::vector<int64_t> prompt_tokens(const problem& p);

/// The answer's numbers separated by ',', then `<eos>`. Throws like `numbers_of`, and for a
/// number outside 0..99.
std::vector<int64_t> target_tokens(const problem& p);

/// The problem `ids` states (the inverse of `prompt_tokens`): three numbers, a step of at least
/// 1 and an end not below the start. Throws std::invalid_argument saying what is wrong for
/// anything else.
problem parse_prompt(const std::vector<int64_t>& ids);

} // namespace rlforge::examples::counting
