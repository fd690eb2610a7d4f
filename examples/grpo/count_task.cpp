// The GRPO job's short-prompt, long-answer task (count_task.hpp).
#include "examples/grpo/count_task.hpp"

#include <algorithm>
#include <stdexcept>

#include "strings/format.hpp"

namespace rlforge::examples::counting {

namespace {

constexpr int most_numbers = 100;
constexpr int largest_step = 9;
constexpr const char* who = "count task";

/// The count of numbers from `from` in steps of `step` while at most `to` (to >= from).
int count_of(int from, int step, int to) {
  return (to - from) / step + 1;
}

} // namespace

task::task(task_config cfg) : cfg_(cfg) {
  if (cfg_.min_numbers < 2)
    throw std::invalid_argument("count task: min_numbers must be >= 2, got " +
                                std::to_string(cfg_.min_numbers));
  if (cfg_.max_numbers < cfg_.min_numbers || cfg_.max_numbers > most_numbers)
    throw std::invalid_argument("count task: max_numbers must be in " +
                                std::to_string(cfg_.min_numbers) + ".." +
                                std::to_string(most_numbers) + " (from min_numbers), got " +
                                std::to_string(cfg_.max_numbers));
  if (cfg_.max_step < 1 || cfg_.max_step > largest_step)
    throw std::invalid_argument("count task: max_step must be in 1.." +
                                std::to_string(largest_step) + ", got " +
                                std::to_string(cfg_.max_step));
  for (int step = 1; step <= cfg_.max_step; ++step)
    for (int from = 0; from < 100; ++from)
      for (int to = from; to < 100; ++to) {
        const int n = count_of(from, step, to);
        problems_ += n >= cfg_.min_numbers && n <= cfg_.max_numbers ? 1 : 0;
      }
  // At most a quarter held out, so drawing a training problem rejects few.
  const int64_t limit = problems_ / 4;
  if (cfg_.held_out < 1 || cfg_.held_out > limit)
    throw std::invalid_argument("count task: held_out must be in 1.." + std::to_string(limit) +
                                " (a quarter of the " + std::to_string(problems_) +
                                " problems), got " + std::to_string(cfg_.held_out));
  if (!(cfg_.partial_credit >= 0 && cfg_.partial_credit < 1))
    throw std::invalid_argument("count task: partial_credit must be in [0, 1), got " +
                                strings::number_text(cfg_.partial_credit));
  // The held-out generator is separate from any training generator, so the split depends on
  // the seed alone.
  std::mt19937_64 rng(cfg_.seed ^ 0x2545f4914f6cdd1dULL);
  while (static_cast<int>(held_out_.size()) < cfg_.held_out) {
    auto p = draw(rng);
    if (held_out_set_.insert(p).second)
      held_out_.push_back(p);
  }
}

problem task::draw(std::mt19937_64& rng) const {
  const int n = grpo::heavy_tailed_length(rng, cfg_.min_numbers, cfg_.max_numbers);
  // n numbers span (n - 1) steps inside 0..99.
  const int widest = std::min(cfg_.max_step, 99 / (n - 1));
  problem p;
  p.step = std::uniform_int_distribution<int>(1, widest)(rng);
  const int last_from = 99 - (n - 1) * p.step;
  p.from = std::uniform_int_distribution<int>(0, last_from)(rng);
  // Any end from the n-th number up to just before the (n+1)-th gives exactly n numbers.
  const int lowest_to = p.from + (n - 1) * p.step;
  p.to = std::uniform_int_distribution<int>(lowest_to, std::min(99, lowest_to + p.step - 1))(rng);
  return p;
}

problem task::sample_train(std::mt19937_64& rng) const {
  // Held-out problems are at most a quarter of all, so rejection ends quickly.
  for (;;) {
    auto p = draw(rng);
    if (!is_held_out(p))
      return p;
  }
}

std::string task::description() const {
  return "counting " + std::to_string(cfg_.min_numbers) + "-" + std::to_string(cfg_.max_numbers) +
         " numbers in 0..99 in steps of 1-" + std::to_string(cfg_.max_step);
}

int64_t task::max_answer_tokens() const {
  return 2 * static_cast<int64_t>(cfg_.max_numbers);
}

int64_t task::context() const {
  // <bos>, three numbers with ',' ',' '=', then the answer.
  return 7 + max_answer_tokens();
}

std::vector<int64_t> task::sample_prompt(std::mt19937_64& rng) const {
  return prompt_tokens(sample_train(rng));
}

std::vector<std::vector<int64_t>> task::held_out_prompts() const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(held_out_.size());
  for (const auto& p : held_out_)
    out.push_back(prompt_tokens(p));
  return out;
}

problem task::read(const std::vector<int64_t>& prompt) const {
  const auto p = parse_prompt(prompt);
  const int n = count_of(p.from, p.step, p.to);
  if (p.step > cfg_.max_step || n < cfg_.min_numbers || n > cfg_.max_numbers)
    throw std::invalid_argument(
        "count task: the prompt " + grpo::shown_ids(prompt) +
        " is not a problem of the task: it counts " + std::to_string(n) + " numbers in steps of " +
        std::to_string(p.step) + ", and the task counts " + std::to_string(cfg_.min_numbers) + "-" +
        std::to_string(cfg_.max_numbers) + " in steps of 1-" + std::to_string(cfg_.max_step));
  return p;
}

std::vector<int64_t> task::target(const std::vector<int64_t>& prompt) const {
  return target_tokens(read(prompt));
}

double task::reward(const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& response) const {
  return grpo::number_answer_reward(target(prompt), response, cfg_.partial_credit);
}

double task::accuracy(const std::vector<int64_t>& prompt,
                      const std::vector<int64_t>& response) const {
  return grpo::number_answer_accuracy(target(prompt), response);
}

std::vector<int> numbers_of(const problem& p) {
  if (p.step < 1 || p.to < p.from)
    throw std::invalid_argument("count task: a problem needs a step >= 1 and an end not below "
                                "its start, got from " +
                                std::to_string(p.from) + " step " + std::to_string(p.step) +
                                " to " + std::to_string(p.to));
  std::vector<int> out;
  for (int x = p.from; x <= p.to; x += p.step)
    out.push_back(x);
  return out;
}

std::vector<int64_t> prompt_tokens(const problem& p) {
  return grpo::number_prompt({p.from, p.step, p.to}, who);
}

std::vector<int64_t> target_tokens(const problem& p) {
  return grpo::number_answer(numbers_of(p), who);
}

problem parse_prompt(const std::vector<int64_t>& ids) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("count task: the prompt " + grpo::shown_ids(ids) +
                                 " is not a problem of the task: " + why);
  };
  std::vector<int> numbers;
  if (auto why = grpo::read_number_prompt(ids, numbers); !why.empty())
    throw bad(why);
  if (numbers.size() != 3)
    throw bad("it has " + std::to_string(numbers.size()) +
              " numbers, not three (start, step, end)");
  problem p{numbers[0], numbers[1], numbers[2]};
  if (p.step < 1)
    throw bad("the step is 0");
  if (p.to < p.from)
    throw bad("the end " + std::to_string(p.to) + " is below the start " + std::to_string(p.from));
  return p;
}

} // namespace rlforge::examples::counting
