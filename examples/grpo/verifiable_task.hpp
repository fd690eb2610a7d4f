#pragma once
// What the GRPO job needs of a built-in task (--task): prompts as token ids, the supervised
// target of the warm start and an exact reward, each computed from the prompt alone. A rollout
// carries its prompt, so checkpoints, resumes and recoveries need nothing of the task but that.
// Plain C++: no torch, no CAF.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace rlforge::examples::grpo {

/// A task whose answers a program checks exactly. Implementations are immutable after
/// construction: every member is const and thread-safe; `sample_prompt` only touches the
/// caller's generator.
class verifiable_task {
public:
  virtual ~verifiable_task() = default;

  /// One line for the job's opening and its plot, e.g. "2-digit addition".
  virtual std::string description() const = 0;
  /// Number of token ids of the task's tokenizer (the model's vocabulary).
  virtual int64_t vocab_size() const = 0;
  /// The end-of-sequence id: sampling stops at it, every target ends with it.
  virtual int64_t eos_id() const = 0;
  /// Positions the longest prompt and its longest answer take together (the model's context).
  virtual int64_t context() const = 0;
  /// Most tokens a correct answer takes, end-of-sequence included (the generation budget).
  virtual int64_t max_answer_tokens() const = 0;
  /// A training prompt drawn with `rng`; never a held-out one.
  virtual std::vector<int64_t> sample_prompt(std::mt19937_64& rng) const = 0;
  /// The held-out prompts, distinct, in a fixed order that depends on the task's seed alone.
  virtual std::vector<std::vector<int64_t>> held_out_prompts() const = 0;
  /// The correct answer to `prompt`, end-of-sequence included. Throws std::invalid_argument,
  /// saying what is wrong, for a prompt this task does not make.
  virtual std::vector<int64_t> target(const std::vector<int64_t>& prompt) const = 0;
  /// The reward of `response` (a sampler's output: any ids) to `prompt`, in [0, 1]: 1 exactly
  /// when the response is the target, less otherwise (partial credit where the task gives it).
  /// Throws like `target` for a prompt this task does not make.
  virtual double reward(const std::vector<int64_t>& prompt,
                        const std::vector<int64_t>& response) const = 0;
  /// How right `response` is, in [0, 1], as held-out accuracy counts it: 1 for the target.
  /// The default counts exact answers only (1 or 0); a task whose exact answers are rare for a
  /// small model counts the share it has right (say, numbers in place). Throws like `target`.
  virtual double accuracy(const std::vector<int64_t>& prompt,
                          const std::vector<int64_t>& response) const {
    return reward(prompt, response) == 1.0 ? 1.0 : 0.0;
  }
  /// The held-out accuracy gain a full run of the job must reach (its goal), in (0, 1].
  virtual double required_gain() const = 0;
};

/// The mean `task.accuracy` of `responses[i]` to `prompts[i]`. Throws std::invalid_argument
/// naming both sizes when they differ, or when both are empty.
double mean_accuracy(const verifiable_task& task,
                     const std::vector<std::vector<int64_t>>& prompts,
                     const std::vector<std::vector<int64_t>>& responses);

} // namespace rlforge::examples::grpo
