#pragma once

// Shared by the tests/tinker suites: an expected-error check and datum builders.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "tinker/error.hpp"
#include "tinker/types.hpp"

namespace rlforge::tinker::test {

/// Runs `f`; expects a `request_error` of `category` whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& f, error_category category,
                         std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const request_error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    return;
  }
  ADD_FAILURE() << "no request_error thrown (expected one mentioning " << *parts.begin() << ")";
}

inline void expect_user_error(const std::function<void()>& f,
                              std::initializer_list<std::string> parts) {
  expect_error(f, error_category::user, parts);
}

inline tensor_data floats(std::vector<double> v) {
  tensor_data t;
  t.type = dtype::float32;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

inline tensor_data ints(std::vector<int64_t> v, dtype type = dtype::int64) {
  tensor_data t;
  t.type = type;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

/// A datum of `tokens` scored on the shifted inputs (plus `last`), with weights 1.
inline datum sft_datum(std::vector<int64_t> tokens, int64_t last) {
  datum d;
  d.tokens = tokens;
  std::vector<int64_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(last);
  d.loss_fn_inputs["target_tokens"] = ints(targets);
  d.loss_fn_inputs["weights"] = floats(std::vector<double>(tokens.size(), 1.0));
  return d;
}

} // namespace rlforge::tinker::test
