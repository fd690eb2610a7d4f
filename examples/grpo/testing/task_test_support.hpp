#pragma once
// What the built-in tasks' unit tests share (arith_task_test.cpp, sort_task_test.cpp).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlforge::examples::grpo::testing {

/// The message of the std::invalid_argument `f` throws, or "no exception".
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

/// `Tokenizer::encode(text)`, then its end-of-sequence id when `eos`.
template <class Tokenizer> std::vector<int64_t> token_ids(const std::string& text, bool eos) {
  auto out = Tokenizer::encode(text);
  if (eos)
    out.push_back(Tokenizer::eos_id);
  return out;
}

} // namespace rlforge::examples::grpo::testing
