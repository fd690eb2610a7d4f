#include "examples/grpo/arith_task.hpp"

#include <algorithm>
#include <stdexcept>

namespace rlforge::examples::arith {

namespace {

constexpr int64_t digit0_id = 3;
constexpr const char* symbols = "+-*="; // ids 13..16

int64_t pow10(int n) {
  int64_t x = 1;
  for (int i = 0; i < n; ++i)
    x *= 10;
  return x;
}

} // namespace

std::vector<int64_t> tokenizer::encode(const std::string& text) {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      ids.push_back(digit0_id + (c - '0'));
      continue;
    }
    bool found = false;
    for (int64_t k = 0; symbols[k] != '\0'; ++k) {
      if (symbols[k] == c) {
        ids.push_back(digit0_id + 10 + k);
        found = true;
        break;
      }
    }
    if (!found) {
      auto shown = (c >= 32 && c < 127) ? std::string(1, c)
                                        : "\\x" + std::to_string(static_cast<unsigned char>(c));
      throw std::invalid_argument("tokenizer: character '" + shown + "' at position " +
                                  std::to_string(i) + " of \"" + text +
                                  "\" is not in the alphabet (digits and + - * =)");
    }
  }
  return ids;
}

std::string tokenizer::decode(const std::vector<int64_t>& ids) {
  return grpo::decode_ids(ids, vocab_size(), "tokenizer", [](int64_t id) {
    return id < digit0_id + 10 ? std::string(1, static_cast<char>('0' + (id - digit0_id)))
                               : std::string(1, symbols[id - digit0_id - 10]);
  });
}

int64_t problem::answer() const {
  switch (op) {
    case '+':
      return a + b;
    case '-':
      return a - b;
    case '*':
      return a * b;
    default:
      throw std::invalid_argument(std::string("problem: unknown operator '") + op + "'");
  }
}

std::string problem::prompt_text() const {
  return std::to_string(a) + op + std::to_string(b) + "=";
}

std::string problem::answer_text() const {
  return std::to_string(answer());
}

task::task(task_config cfg) : cfg_(std::move(cfg)) {
  if (cfg_.digits < 1 || cfg_.digits > 4)
    throw std::invalid_argument("task: digits must be in 1..4, got " +
                                std::to_string(cfg_.digits));
  if (cfg_.ops.empty())
    throw std::invalid_argument("task: ops is empty; give a subset of \"+-*\"");
  for (size_t i = 0; i < cfg_.ops.size(); ++i) {
    char c = cfg_.ops[i];
    if (c != '+' && c != '-' && c != '*')
      throw std::invalid_argument(std::string("task: unknown operator '") + c +
                                  "' in ops \"" + cfg_.ops + "\"; use a subset of \"+-*\"");
    if (cfg_.ops.find(c) != i)
      throw std::invalid_argument(std::string("task: operator '") + c + "' repeated in ops \"" +
                                  cfg_.ops + "\"");
  }
  auto limit = total_problems() / 4;
  if (cfg_.held_out < 1 || cfg_.held_out > limit)
    throw std::invalid_argument("task: held_out must be in 1.." + std::to_string(limit) +
                                " (a quarter of the " + std::to_string(total_problems()) +
                                " problems), got " + std::to_string(cfg_.held_out));
  // The held-out generator is separate from any training generator, so the split depends on
  // the seed alone.
  std::mt19937_64 rng(cfg_.seed ^ 0x9e3779b97f4a7c15ULL);
  while (static_cast<int>(held_out_.size()) < cfg_.held_out) {
    auto p = draw(rng);
    if (held_out_set_.insert(p).second)
      held_out_.push_back(p);
  }
}

problem task::draw(std::mt19937_64& rng) const {
  std::uniform_int_distribution<int64_t> operand(0, pow10(cfg_.digits) - 1);
  std::uniform_int_distribution<size_t> op(0, cfg_.ops.size() - 1);
  problem p;
  p.a = operand(rng);
  p.b = operand(rng);
  p.op = cfg_.ops[op(rng)];
  return p;
}

problem task::sample_train(std::mt19937_64& rng) const {
  // Held-out problems are at most a quarter of the distribution, so rejection ends quickly.
  for (;;) {
    auto p = draw(rng);
    if (!is_held_out(p))
      return p;
  }
}

int64_t task::total_problems() const {
  auto n = pow10(cfg_.digits);
  return n * n * static_cast<int64_t>(cfg_.ops.size());
}

int64_t task::max_answer_tokens() const {
  auto top = pow10(cfg_.digits) - 1;
  int64_t widest = 0;
  for (char c : cfg_.ops) {
    problem hi{top, top, c};
    problem lo{0, top, c};
    widest = std::max<int64_t>(widest, static_cast<int64_t>(hi.answer_text().size()));
    widest = std::max<int64_t>(widest, static_cast<int64_t>(lo.answer_text().size()));
  }
  return widest + 1;
}

std::vector<int64_t> prompt_tokens(const problem& p) {
  std::vector<int64_t> ids{tokenizer::bos_id};
  auto body = tokenizer::encode(p.prompt_text());
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<int64_t> target_tokens(const problem& p) {
  auto ids = tokenizer::encode(p.answer_text());
  ids.push_back(tokenizer::eos_id);
  return ids;
}

std::optional<int64_t> parse_answer(const std::vector<int64_t>& response) {
  constexpr int64_t minus_id = digit0_id + 11;
  if (response.size() < 2 || response.back() != tokenizer::eos_id)
    return std::nullopt;
  size_t i = 0;
  bool negative = false;
  if (response[0] == minus_id) {
    negative = true;
    i = 1;
  }
  size_t n_digits = response.size() - 1 - i;
  if (n_digits < 1 || n_digits > 10)
    return std::nullopt;
  int64_t value = 0;
  for (; i + 1 < response.size(); ++i) {
    auto id = response[i];
    if (id < digit0_id || id >= digit0_id + 10)
      return std::nullopt;
    value = value * 10 + (id - digit0_id);
  }
  return negative ? -value : value;
}

double reward(const problem& p, const std::vector<int64_t>& response, double format_reward) {
  if (!(format_reward >= 0.0 && format_reward < 1.0))
    throw std::invalid_argument("reward: format_reward must be in [0, 1), got " +
                                std::to_string(format_reward));
  // Exact token match rules out equivalent spellings such as leading zeros or "-0".
  if (response == target_tokens(p))
    return 1.0;
  return parse_answer(response) ? format_reward : 0.0;
}

problem parse_prompt(const std::vector<int64_t>& ids) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("arith: the prompt " + tokenizer::decode(ids) + " is not a "
                                 "problem of the task: " + why);
  };
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= tokenizer::vocab_size())
      throw std::invalid_argument("arith: the prompt's id " + std::to_string(ids[i]) +
                                  " at position " + std::to_string(i) +
                                  " is outside the vocabulary");
  if (ids.empty() || ids.front() != tokenizer::bos_id)
    throw bad("it does not start with <bos>");
  if (ids.back() != tokenizer::encode("=").front())
    throw bad("it does not end with '='");
  const auto text = tokenizer::decode(std::vector<int64_t>(ids.begin() + 1, ids.end() - 1));
  const auto at = text.find_first_of("+-*", 1);
  const auto digits_only = [](const std::string& t) {
    return !t.empty() && t.size() <= 10 &&
           t.find_first_not_of("0123456789") == std::string::npos;
  };
  if (at == std::string::npos || at + 1 >= text.size() || !digits_only(text.substr(0, at)) ||
      !digits_only(text.substr(at + 1)))
    throw bad("it is not a<op>b= with operands of 1-10 digits");
  return problem{std::stoll(text.substr(0, at)), std::stoll(text.substr(at + 1)), text[at]};
}

std::string task::description() const {
  std::string what = cfg_.ops == "+" ? "addition" : "arithmetic (" + cfg_.ops + ")";
  return std::to_string(cfg_.digits) + "-digit " + what;
}

int64_t task::context() const {
  // <bos>, two operands, the operator and '=', then the answer.
  return 2 * cfg_.digits + 3 + max_answer_tokens();
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

std::vector<int64_t> task::target(const std::vector<int64_t>& prompt) const {
  return target_tokens(parse_prompt(prompt));
}

double task::reward(const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& response) const {
  return arith::reward(parse_prompt(prompt), response);
}

} // namespace rlforge::examples::arith
