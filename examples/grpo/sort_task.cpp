// The GRPO job's long-response task (sort_task.hpp).
#include "examples/grpo/sort_task.hpp"

#include <algorithm>
#include <stdexcept>

#include "strings/format.hpp"

namespace rlforge::examples::sorting {

namespace {

constexpr int largest_list = 100;
constexpr int most_held_out = 100000;

} // namespace

task::task(task_config cfg) : cfg_(cfg) {
  if (cfg_.min_numbers < 2)
    throw std::invalid_argument("sort task: min_numbers must be >= 2, got " +
                                std::to_string(cfg_.min_numbers));
  if (cfg_.max_numbers < cfg_.min_numbers || cfg_.max_numbers > largest_list)
    throw std::invalid_argument("sort task: max_numbers must be in " +
                                std::to_string(cfg_.min_numbers) + ".." +
                                std::to_string(largest_list) + " (from min_numbers), got " +
                                std::to_string(cfg_.max_numbers));
  // Distinct lists of the lengths asked (100!/(100-n)! of length n; counted up to a cap): at
  // most a quarter of them are held out, so drawing a training list rejects few.
  int64_t lists = 0;
  for (int n = cfg_.min_numbers; n <= cfg_.max_numbers && lists < 4 * most_held_out; ++n) {
    int64_t of_length = 1;
    for (int k = 0; k < n && of_length < 4 * most_held_out; ++k)
      of_length *= 100 - k;
    lists += of_length;
  }
  const int64_t limit = std::min<int64_t>(most_held_out, lists / 4);
  if (cfg_.held_out < 1 || cfg_.held_out > limit)
    throw std::invalid_argument("sort task: held_out must be in 1.." + std::to_string(limit) +
                                ", got " + std::to_string(cfg_.held_out));
  if (!(cfg_.partial_credit >= 0 && cfg_.partial_credit < 1))
    throw std::invalid_argument("sort task: partial_credit must be in [0, 1), got " +
                                strings::number_text(cfg_.partial_credit));
  // The held-out generator is separate from any training generator, so the split depends on
  // the seed alone.
  std::mt19937_64 rng(cfg_.seed ^ 0x5851f42d4c957f2dULL);
  while (static_cast<int>(held_out_.size()) < cfg_.held_out) {
    auto list = draw(rng);
    if (held_out_set_.insert(list).second)
      held_out_.push_back(std::move(list));
  }
}

std::vector<int> task::draw(std::mt19937_64& rng) const {
  const int n = grpo::heavy_tailed_length(rng, cfg_.min_numbers, cfg_.max_numbers);
  // The first n of a random permutation of 0..99 (a partial Fisher-Yates shuffle).
  std::vector<int> pool(100);
  for (int k = 0; k < 100; ++k)
    pool[static_cast<size_t>(k)] = k;
  for (int k = 0; k < n; ++k) {
    std::uniform_int_distribution<int> pick(k, 99);
    std::swap(pool[static_cast<size_t>(k)], pool[static_cast<size_t>(pick(rng))]);
  }
  return std::vector<int>(pool.begin(), pool.begin() + n);
}

std::vector<int> task::sample_train(std::mt19937_64& rng) const {
  // Held-out lists are at most a quarter of all lists, so rejection ends quickly.
  for (;;) {
    auto list = draw(rng);
    if (!is_held_out(list))
      return list;
  }
}

std::string task::description() const {
  return "sorting lists of " + std::to_string(cfg_.min_numbers) + "-" +
         std::to_string(cfg_.max_numbers) + " distinct numbers in 0..99";
}

int64_t task::max_answer_tokens() const {
  return 2 * static_cast<int64_t>(cfg_.max_numbers);
}

int64_t task::context() const {
  // <bos>, the list and '=' (2 per number), then the answer.
  return 1 + 2 * static_cast<int64_t>(cfg_.max_numbers) + max_answer_tokens();
}

std::vector<int64_t> task::sample_prompt(std::mt19937_64& rng) const {
  return prompt_tokens(sample_train(rng));
}

std::vector<std::vector<int64_t>> task::held_out_prompts() const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(held_out_.size());
  for (const auto& list : held_out_)
    out.push_back(prompt_tokens(list));
  return out;
}

std::vector<int64_t> task::target(const std::vector<int64_t>& prompt) const {
  return target_tokens(parse_prompt(prompt));
}

double task::reward(const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& response) const {
  return grpo::number_answer_reward(target(prompt), response, cfg_.partial_credit);
}

double task::accuracy(const std::vector<int64_t>& prompt,
                      const std::vector<int64_t>& response) const {
  return grpo::number_answer_accuracy(target(prompt), response);
}

std::vector<int64_t> prompt_tokens(const std::vector<int>& list) {
  return grpo::number_prompt(list, "sort task");
}

std::vector<int64_t> target_tokens(const std::vector<int>& list) {
  auto sorted = list;
  std::sort(sorted.begin(), sorted.end());
  return grpo::number_answer(sorted, "sort task");
}

std::vector<int> parse_prompt(const std::vector<int64_t>& ids) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("sort task: the prompt " + grpo::shown_ids(ids) +
                                 " is not a list of the task: " + why);
  };
  std::vector<int> list;
  if (auto why = grpo::read_number_prompt(ids, list); !why.empty())
    throw bad(why);
  std::vector<bool> seen(100, false);
  for (int x : list) {
    if (seen[static_cast<size_t>(x)])
      throw bad("the number " + std::to_string(x) + " repeats");
    seen[static_cast<size_t>(x)] = true;
  }
  return list;
}

int64_t numbers_in_place(const std::vector<int>& list, const std::vector<int64_t>& response) {
  return grpo::numbers_in_place(target_tokens(list), response);
}

} // namespace rlforge::examples::sorting
