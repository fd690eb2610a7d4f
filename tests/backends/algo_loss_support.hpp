#pragma once
// Helpers of the loss tests (algo_losses_test.cpp, algo_loss_checks_test.cpp).
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/algo/losses.hpp"
#include "test_support.hpp"

namespace rlforge::backends::testing {

/// Log-probs whose ratio to `old` is exactly `ratios` (up to fp32 rounding).
inline at::Tensor logp_for(const at::Tensor& old, const std::vector<std::vector<double>>& ratios) {
  return (old + t2(ratios).log()).detach().requires_grad_(true);
}

/// A loss config of these values.
inline algo::loss_config values(std::map<std::string, double> v) {
  algo::loss_config c;
  c.values = std::move(v);
  return c;
}

/// The gradient of `out`'s loss with respect to `x`.
inline at::Tensor grad_of(const algo::loss_output& out, const at::Tensor& x) {
  out.loss.backward();
  return x.grad();
}

} // namespace rlforge::backends::testing
