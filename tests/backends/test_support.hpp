/// Helpers shared by the backends unit tests (tests/backends/*_test.cpp): a temporary-directory
/// guard, checks on thrown backends::error values and small tensor factories.
///
/// Header-only; include it after <gtest/gtest.h> is available and bring the helpers in with
/// `using namespace rlforge::backends::testing;`. Inside this namespace, and in files that
/// say `using namespace rlforge::backends;`, name GoogleTest's namespace as `::testing`.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

#include "backends/error.hpp"
#include "tests/support/temp_dir.hpp"

namespace rlforge::backends::testing {

/// Quiet NaN, for inputs that must be masked out or rejected.
inline constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();
/// Positive infinity.
inline constexpr double inf = std::numeric_limits<double>::infinity();

// ---- temporary directories ------------------------------------------------------------------

/// The tests' one temporary directory (tests/support/temp_dir.hpp).
using ::rlforge::test_support::temp_dir;

// ---- errors ---------------------------------------------------------------------------------

/// Expects `f()` to throw a backends::error with the given `code` whose message contains every
/// string of `fragments`. A call that returns normally is a (fatal) test failure; any other
/// exception propagates and fails the test.
template <class F>
void expect_error(F&& f, error_code code, const std::vector<std::string>& fragments) {
  try {
    std::forward<F>(f)();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)
          << "'" << frag << "' not in: " << e.what();
    return;
  }
  std::string wanted;
  for (const auto& frag : fragments)
    wanted += (wanted.empty() ? "" : ", ") + ("'" + frag + "'");
  FAIL() << "expected backends::error " << to_string(code) << " mentioning " << wanted;
}

/// expect_error() for the most common code: `invalid_argument`.
template <class F> void expect_error(F&& f, const std::vector<std::string>& fragments) {
  expect_error(std::forward<F>(f), error_code::invalid_argument, fragments);
}

// ---- tensors --------------------------------------------------------------------------------

/// A float [rows, columns] tensor from nested rows (all rows as long as the first).
inline at::Tensor t2(const std::vector<std::vector<double>>& rows) {
  std::vector<float> flat;
  for (const auto& r : rows)
    for (double x : r)
      flat.push_back(static_cast<float>(x));
  return at::tensor(flat, at::TensorOptions().dtype(at::kFloat))
      .view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

/// Element (i, j) of a 2-D tensor, as a double.
inline double v(const at::Tensor& t, int64_t i, int64_t j) {
  return t.index({i, j}).item<double>();
}

/// EXPECT_NEAR with a tolerance relative to the expected value (absolute below magnitude 1).
inline void expect_close(double got, double want, double rel = 1e-5) {
  EXPECT_NEAR(got, want, rel * std::max(1.0, std::abs(want)));
}

/// Whether `a` and `b` have the same dtype, shape and bytes (bit for bit: NaN payloads and -0.0
/// count). Empty tensors compare without touching their (possibly null) data.
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes())
    return false;
  auto ca = a.contiguous();
  auto cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

/// Marks `t` as a leaf that requires a gradient, and returns it.
inline at::Tensor leaf(at::Tensor t) {
  return t.set_requires_grad(true);
}

} // namespace rlforge::backends::testing
