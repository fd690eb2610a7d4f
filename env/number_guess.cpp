#include "env/number_guess.hpp"

#include <cctype>

namespace rlforge::env {

int number_guess::secret_for_seed(int64_t seed) {
  uint64_t z = static_cast<uint64_t>(seed) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return static_cast<int>(z % 100) + 1;
}

bool number_guess::last_integer(const std::string& text, int64_t& out) {
  bool found = false;
  std::size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    const bool negative = i > 0 && text[i - 1] == '-';
    int64_t v = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (v < 1000000000000LL)
        v = v * 10 + (text[i] - '0');
      ++i;
    }
    out = negative ? -v : v;
    found = true;
  }
  return found;
}

reset_result number_guess::on_reset(const reset_request& request) {
  const auto& task = request.task;
  if (task.contains("secret")) {
    if (!task["secret"].is_number_integer() || task["secret"] < 1 || task["secret"] > 100)
      throw env_error(failure::environment, "task.secret must be an integer in [1, 100]");
    secret_ = task["secret"].get<int>();
  } else {
    secret_ = secret_for_seed(request.seed.value_or(0));
  }
  max_turns_ = 5;
  if (task.contains("max_turns")) {
    if (!task["max_turns"].is_number_integer() || task["max_turns"] < 1)
      throw env_error(failure::environment, "task.max_turns must be a positive integer");
    max_turns_ = task["max_turns"].get<int>();
  }
  turn_ = 0;
  return {"I am thinking of a number between 1 and 100. You have " + std::to_string(max_turns_) +
              " guesses. Answer with a number.",
          {{"max_turns", max_turns_}}};
}

step_result number_guess::on_step(const std::string& action) {
  ++turn_;
  step_result r;
  int64_t guess = 0;
  const bool found = last_integer(action, guess);
  if (!found) {
    r.observation = "I could not find a number in your answer.";
  } else if (guess == secret_) {
    r.observation = "Correct! The number was " + std::to_string(secret_) + ".";
    r.reward = 1.0;
    r.done = true;
  } else {
    r.observation =
        std::string(guess < secret_ ? "Higher" : "Lower") + " than " + std::to_string(guess) + ".";
  }
  if (!r.done && turn_ >= max_turns_) {
    r.observation += " Out of guesses: the number was " + std::to_string(secret_) + ".";
    r.done = true;
  }
  r.info = {{"turn", turn_}, {"guess", found ? nlohmann::json(guess) : nlohmann::json()}};
  return r;
}

} // namespace rlforge::env
