#pragma once
// The GRPO job's default task (--task arith): multi-digit arithmetic ("37+48=" -> "85") with a
// character-level tokenizer, a seeded problem generator whose held-out problems never appear in
// training, answer parsing and the reward. Plain C++: no torch, no CAF.
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "examples/grpo/task_tokens.hpp"
#include "examples/grpo/verifiable_task.hpp"

namespace rlforge::examples::arith {

/// Character-level tokenizer over digits, '+', '-', '*', '=' and three special tokens.
///
/// Ids: 0 = padding, 1 = beginning of sequence, 2 = end of sequence, 3..12 = '0'..'9',
/// 13 = '+', 14 = '-', 15 = '*', 16 = '='. Stateless; every member is reentrant.
class tokenizer {
public:
  static constexpr int64_t pad_id = grpo::pad_id;
  static constexpr int64_t bos_id = grpo::bos_id;
  static constexpr int64_t eos_id = grpo::eos_id;

  /// Number of token ids (17).
  static constexpr int64_t vocab_size() { return 17; }

  /// The ids of `text`, one per character, without special tokens. Throws
  /// std::invalid_argument naming the first character outside the alphabet and its position.
  static std::vector<int64_t> encode(const std::string& text);

  /// The text of `ids`: special tokens render as `<pad>`, `<bos>`, `<eos>`. Throws
  /// std::invalid_argument naming the first id outside [0, vocab_size()) and its position.
  static std::string decode(const std::vector<int64_t>& ids);
};

/// One problem `a op b`; the answer may be negative (subtraction).
struct problem {
  int64_t a = 0;
  int64_t b = 0;
  char op = '+';

  /// The exact answer.
  int64_t answer() const;
  /// "a<op>b=", e.g. "37+48=".
  std::string prompt_text() const;
  /// The answer in decimal, e.g. "85" or "-11".
  std::string answer_text() const;

  friend bool operator<(const problem& x, const problem& y) {
    return std::tie(x.a, x.b, x.op) < std::tie(y.a, y.b, y.op);
  }
  friend bool operator==(const problem& x, const problem& y) {
    return x.a == y.a && x.b == y.b && x.op == y.op;
  }
};

/// What the task generates.
struct task_config {
  int digits = 2;           ///< operands are in [0, 10^digits), 1..4
  std::string ops = "+";    ///< operators drawn uniformly, a non-empty subset of "+-*", no repeats
  int held_out = 200;       ///< number of held-out problems, >= 1 and <= a quarter of all problems
  uint64_t seed = 1;        ///< determines the held-out set
};

/// The problem distribution, split into a fixed held-out set and the training problems (all the
/// others). Immutable after construction; `sample_train` only touches the caller's generator.
/// As a `verifiable_task` its prompts are `prompt_tokens` of its problems, its targets
/// `target_tokens`, its reward `reward` without format credit, and its goal +20 points.
class task final : public grpo::verifiable_task {
public:
  /// Draws the held-out set from `cfg.seed`. Throws std::invalid_argument naming the field and
  /// value for digits outside 1..4, an empty or unknown operator list or a repeated operator,
  /// and a held-out count below 1 or above a quarter of the distinct problems.
  explicit task(task_config cfg);

  const task_config& config() const { return cfg_; }

  /// The held-out problems, in generation order (distinct).
  const std::vector<problem>& held_out() const { return held_out_; }

  /// True when `p` is in the held-out set.
  bool is_held_out(const problem& p) const { return held_out_set_.count(p) > 0; }

  /// A uniformly drawn training problem (never a held-out one).
  problem sample_train(std::mt19937_64& rng) const;

  /// Number of distinct problems of the distribution (held-out ones included).
  int64_t total_problems() const;

  /// Most tokens a correct answer takes, end-of-sequence included (the generation budget).
  int64_t max_answer_tokens() const override;

  // verifiable_task
  std::string description() const override;
  int64_t vocab_size() const override { return tokenizer::vocab_size(); }
  int64_t eos_id() const override { return tokenizer::eos_id; }
  int64_t context() const override;
  std::vector<int64_t> sample_prompt(std::mt19937_64& rng) const override;
  std::vector<std::vector<int64_t>> held_out_prompts() const override;
  std::vector<int64_t> target(const std::vector<int64_t>& prompt) const override;
  double reward(const std::vector<int64_t>& prompt,
                const std::vector<int64_t>& response) const override;
  double required_gain() const override { return 0.20; }

private:
  problem draw(std::mt19937_64& rng) const;

  task_config cfg_;
  std::vector<problem> held_out_;
  std::set<problem> held_out_set_;
};

/// `<bos>` followed by the ids of "a<op>b=".
std::vector<int64_t> prompt_tokens(const problem& p);

/// The problem `ids` states: `<bos>` then "a<op>b=" with operands of at most 10 digits and one
/// operator of "+-*". Throws std::invalid_argument saying what is wrong otherwise.
problem parse_prompt(const std::vector<int64_t>& ids);

/// The ids of the answer followed by `<eos>`: the supervised target of the warm start.
std::vector<int64_t> target_tokens(const problem& p);

/// The number a response states: an optional '-' and 1..10 digits, then `<eos>`, and nothing
/// else (an answer without `<eos>`, with a stray symbol or with extra tokens after `<eos>` is
/// not well-formed). Ids outside the vocabulary make it ill-formed rather than throwing, since
/// responses come from a sampler.
std::optional<int64_t> parse_answer(const std::vector<int64_t>& response);

/// The verifiable reward of `response` to `p`: 1 when it states exactly the answer and ends with
/// `<eos>`; `format_reward` when it is well-formed (see `parse_answer`) but wrong; 0 otherwise.
/// Throws std::invalid_argument for a `format_reward` outside [0, 1).
double reward(const problem& p, const std::vector<int64_t>& response, double format_reward = 0.0);

} // namespace rlforge::examples::arith
