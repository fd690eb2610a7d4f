// The GRPO job's long-response task (sort_task.hpp).
#include "examples/grpo/sort_task.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "strings/format.hpp"

namespace rlforge::examples::sorting {

namespace {

constexpr int largest_list = 100;
constexpr int most_held_out = 100000;

} // namespace

std::vector<int64_t> tokenizer::encode(const std::string& text) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ',') {
      ids.push_back(comma_id);
    } else if (c == '=') {
      ids.push_back(equals_id);
    } else if (c >= '0' && c <= '9') {
      size_t end = i;
      while (end < text.size() && text[end] >= '0' && text[end] <= '9')
        ++end;
      const auto digits = text.substr(i, end - i);
      if (digits.size() > 2 || (digits.size() == 2 && digits[0] == '0'))
        throw std::invalid_argument("sort tokenizer: the number " + digits + " at position " +
                                    std::to_string(i) +
                                    " is not in 0..99 written without a leading zero");
      ids.push_back(number0_id + std::stoi(digits));
      i = end - 1;
    } else {
      throw std::invalid_argument("sort tokenizer: character " +
                                  strings::in_quotes(std::string(1, c)) + " at position " +
                                  std::to_string(i) +
                                  " is not in the alphabet (numbers 0..99 , =)");
    }
  }
  return ids;
}

std::string tokenizer::decode(const std::vector<int64_t>& ids) {
  return grpo::decode_ids(ids, vocab_size(), "sort tokenizer", [](int64_t id) {
    return id == comma_id ? std::string(",")
         : id == equals_id ? std::string("=")
                           : std::to_string(id - number0_id);
  });
}

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
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double u = unit(rng);
  const int span = cfg_.max_numbers - cfg_.min_numbers + 1;
  const int n = std::min(cfg_.max_numbers,
                         cfg_.min_numbers + static_cast<int>(std::floor(span * u * u * u)));
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
  const auto list = parse_prompt(prompt);
  // Every number in place is exactly the target (numbers_in_place).
  const auto in_place = numbers_in_place(list, response);
  if (in_place == static_cast<int64_t>(list.size()))
    return 1.0;
  return cfg_.partial_credit * static_cast<double>(in_place) / static_cast<double>(list.size());
}

double task::accuracy(const std::vector<int64_t>& prompt,
                      const std::vector<int64_t>& response) const {
  const auto list = parse_prompt(prompt);
  return static_cast<double>(numbers_in_place(list, response)) / static_cast<double>(list.size());
}

namespace {

/// The numbers separated by ',', then `last`.
std::vector<int64_t> list_tokens(const std::vector<int>& list, int64_t last) {
  std::vector<int64_t> ids;
  ids.reserve(2 * list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] < 0 || list[i] > 99)
      throw std::invalid_argument("sort task: the number " + std::to_string(list[i]) +
                                  " at position " + std::to_string(i) + " is not in 0..99");
    ids.push_back(tokenizer::number0_id + list[i]);
    ids.push_back(i + 1 < list.size() ? tokenizer::comma_id : last);
  }
  return ids;
}

} // namespace

std::vector<int64_t> prompt_tokens(const std::vector<int>& list) {
  std::vector<int64_t> ids{tokenizer::bos_id};
  auto body = list_tokens(list, tokenizer::equals_id);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<int64_t> target_tokens(const std::vector<int>& list) {
  auto sorted = list;
  std::sort(sorted.begin(), sorted.end());
  return list_tokens(sorted, tokenizer::eos_id);
}

std::vector<int> parse_prompt(const std::vector<int64_t>& ids) {
  const auto is_number = [](int64_t id) {
    return id >= tokenizer::number0_id && id < tokenizer::vocab_size();
  };
  const auto bad = [&](const std::string& why) {
    std::string shown;
    try {
      shown = tokenizer::decode(ids);
    } catch (const std::invalid_argument& e) {
      shown = std::string{"(not text: "} + e.what() + ")";
    }
    return std::invalid_argument("sort task: the prompt " + shown + " is not a list of the "
                                 "task: " + why);
  };
  if (ids.empty() || ids.front() != tokenizer::bos_id)
    throw bad("it does not start with <bos>");
  if (ids.size() % 2 != 1 || ids.size() < 3)
    throw bad("its length is not <bos> then 2 tokens per number");
  std::vector<int> list;
  std::vector<bool> seen(100, false);
  for (size_t i = 1; i < ids.size(); i += 2) {
    const bool last = i + 2 == ids.size();
    if (!is_number(ids[i]) || ids[i + 1] != (last ? tokenizer::equals_id : tokenizer::comma_id))
      throw bad("item " + std::to_string(list.size()) + " is not a number followed by " +
                (last ? "'='" : "','"));
    const auto x = static_cast<int>(ids[i] - tokenizer::number0_id);
    if (seen[static_cast<size_t>(x)])
      throw bad("the number " + std::to_string(x) + " repeats");
    seen[static_cast<size_t>(x)] = true;
    list.push_back(x);
  }
  return list;
}

int64_t numbers_in_place(const std::vector<int>& list, const std::vector<int64_t>& response) {
  const auto target = target_tokens(list);
  int64_t in_place = 0;
  for (size_t i = 0; i + 2 <= target.size(); i += 2) {
    if (i + 2 > response.size() || response[i] != target[i] || response[i + 1] != target[i + 1])
      break;
    ++in_place;
  }
  // The last number counts only when its <eos> ends the response.
  if (in_place == static_cast<int64_t>(list.size()) && response.size() != target.size())
    --in_place;
  return in_place;
}

} // namespace rlforge::examples::sorting
