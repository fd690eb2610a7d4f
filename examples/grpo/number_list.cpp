// The number-list tasks' shared tokens, draws and partial credit (number_list.hpp).
#include "examples/grpo/number_list.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "strings/format.hpp"

namespace rlforge::examples::grpo {

std::vector<int64_t> number_tokenizer::encode(const std::string& text) {
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
        throw std::invalid_argument("number tokenizer: the number " + digits + " at position " +
                                    std::to_string(i) +
                                    " is not in 0..99 written without a leading zero");
      ids.push_back(number0_id + std::stoi(digits));
      i = end - 1;
    } else {
      throw std::invalid_argument(
          "number tokenizer: character " + strings::in_quotes(std::string(1, c)) + " at position " +
          std::to_string(i) + " is not in the alphabet (numbers 0..99 , =)");
    }
  }
  return ids;
}

std::string number_tokenizer::decode(const std::vector<int64_t>& ids) {
  return decode_ids(ids, vocab_size(), "number tokenizer", [](int64_t id) {
    return id == comma_id    ? std::string(",")
           : id == equals_id ? std::string("=")
                             : std::to_string(id - number0_id);
  });
}

namespace {

/// The numbers separated by ',', then `last`.
std::vector<int64_t> list_tokens(const std::vector<int>& numbers, int64_t last, const char* who) {
  std::vector<int64_t> ids;
  ids.reserve(2 * numbers.size());
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (numbers[i] < 0 || numbers[i] > 99)
      throw std::invalid_argument(std::string{who} + ": the number " + std::to_string(numbers[i]) +
                                  " at position " + std::to_string(i) + " is not in 0..99");
    ids.push_back(number_tokenizer::number0_id + numbers[i]);
    ids.push_back(i + 1 < numbers.size() ? number_tokenizer::comma_id : last);
  }
  return ids;
}

} // namespace

std::vector<int64_t> number_prompt(const std::vector<int>& numbers, const char* who) {
  std::vector<int64_t> ids{number_tokenizer::bos_id};
  auto body = list_tokens(numbers, number_tokenizer::equals_id, who);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<int64_t> number_answer(const std::vector<int>& numbers, const char* who) {
  return list_tokens(numbers, number_tokenizer::eos_id, who);
}

std::string read_number_prompt(const std::vector<int64_t>& ids, std::vector<int>& numbers) {
  numbers.clear();
  if (ids.empty() || ids.front() != number_tokenizer::bos_id)
    return "it does not start with <bos>";
  if (ids.size() % 2 != 1 || ids.size() < 3)
    return "its length is not <bos> then 2 tokens per number";
  const auto is_number = [](int64_t id) {
    return id >= number_tokenizer::number0_id && id < number_tokenizer::vocab_size();
  };
  for (size_t i = 1; i < ids.size(); i += 2) {
    const bool last = i + 2 == ids.size();
    const auto after = last ? number_tokenizer::equals_id : number_tokenizer::comma_id;
    if (!is_number(ids[i]) || ids[i + 1] != after) {
      const auto item = numbers.size();
      numbers.clear();
      return "item " + std::to_string(item) + " is not a number followed by " +
             (last ? "'='" : "','");
    }
    numbers.push_back(static_cast<int>(ids[i] - number_tokenizer::number0_id));
  }
  return "";
}

std::string shown_ids(const std::vector<int64_t>& ids) {
  try {
    return number_tokenizer::decode(ids);
  } catch (const std::invalid_argument& e) {
    return std::string{"(not text: "} + e.what() + ")";
  }
}

int heavy_tailed_length(std::mt19937_64& rng, int lo, int hi) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double u = unit(rng);
  const int span = hi - lo + 1;
  return std::min(hi, lo + static_cast<int>(std::floor(span * u * u * u)));
}

int64_t numbers_in_place(const std::vector<int64_t>& answer, const std::vector<int64_t>& response) {
  int64_t in_place = 0;
  for (size_t i = 0; i + 2 <= answer.size(); i += 2) {
    if (i + 2 > response.size() || response[i] != answer[i] || response[i + 1] != answer[i + 1])
      break;
    ++in_place;
  }
  // The last number counts only when its <eos> ends the response.
  if (!answer.empty() && in_place == static_cast<int64_t>(answer.size() / 2) &&
      response.size() != answer.size())
    --in_place;
  return in_place;
}

double number_answer_reward(const std::vector<int64_t>& answer,
                            const std::vector<int64_t>& response, double partial_credit) {
  const auto numbers = static_cast<int64_t>(answer.size() / 2);
  const auto in_place = numbers_in_place(answer, response);
  return in_place == numbers
             ? 1.0
             : partial_credit * static_cast<double>(in_place) / static_cast<double>(numbers);
}

double number_answer_accuracy(const std::vector<int64_t>& answer,
                              const std::vector<int64_t>& response) {
  return static_cast<double>(numbers_in_place(answer, response)) /
         static_cast<double>(answer.size() / 2);
}

} // namespace rlforge::examples::grpo
