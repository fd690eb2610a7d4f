// backends/model/attention.hpp: the GEMM kernel and the batch-invariant kernel agree to fp32
// rounding in values and gradients, and the invariant kernel's result for a query depends only
// on its own allowed keys (not on padding keys, masked keys, or the other queries of the call).
#include "backends/model/attention.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>

using namespace rlforge::backends;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Causal bias [B, T, T] with the first `pad[b]` keys of row b masked (left padding); a padding
/// query sees only itself.
at::Tensor causal_bias(int64_t batch, int64_t len, const std::vector<int64_t>& pad) {
  auto bias = at::zeros({batch, len, len});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < len; ++t)
      for (int64_t j = 0; j < len; ++j)
        if (j > t || (j < pad[static_cast<size_t>(b)] && j != t))
          bias[b][t][j] = neg_inf;
  return bias;
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

} // namespace

TEST(Attention, KernelsAgreeInValuesAndGradients) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const int64_t batch = 2, kv = 2, group = 3, len = 9, d = 20; // d not a multiple of 16
  auto q = at::randn({batch, kv, group * len, d}, gen).requires_grad_(true);
  auto k = at::randn({batch, kv, len, d}, gen).requires_grad_(true);
  auto v = at::randn({batch, kv, len, d}, gen).requires_grad_(true);
  auto bias = causal_bias(batch, len, {0, 3});
  auto g = at::randn({batch, kv, group * len, d}, gen);
  auto a = attention(q, k, v, bias, group, attention_kernel::gemm);
  auto b = attention(q, k, v, bias, group, attention_kernel::invariant);
  EXPECT_LT(max_abs(a, b), 1e-5);
  auto ga = torch::autograd::grad({a}, {q, k, v}, {g});
  auto gb = torch::autograd::grad({b}, {q, k, v}, {g});
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(max_abs(ga[i], gb[i]), 1e-4) << "grad " << i;
}

TEST(Attention, InvariantKernelIgnoresPaddingAndOtherQueriesBitForBit) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const int64_t kv = 1, group = 2, len = 6, d = 32;
  auto q = at::randn({1, kv, group * len, d}, gen);
  auto k = at::randn({1, kv, len, d}, gen);
  auto v = at::randn({1, kv, len, d}, gen);
  auto full = attention(q, k, v, causal_bias(1, len, {0}), group, attention_kernel::invariant);
  // The same last query decoded alone against the cached keys (T = 1, T_total = len) ...
  auto q_last = q.view({1, kv, group, len, d}).narrow(3, len - 1, 1).reshape({1, kv, group, d});
  auto alone = attention(q_last, k, v, at::zeros({1, 1, len}), group, attention_kernel::invariant);
  auto expected =
      full.view({1, kv, group, len, d}).narrow(3, len - 1, 1).reshape({1, kv, group, d});
  EXPECT_TRUE(at::equal(alone, expected));
  // ... and with three left-padding keys of garbage in front of it.
  auto pad_k = at::cat({at::randn({1, kv, 3, d}, gen) * 50, k}, 2);
  auto pad_v = at::cat({at::randn({1, kv, 3, d}, gen) * 50, v}, 2);
  auto pad_bias = at::zeros({1, 1, len + 3});
  pad_bias.narrow(2, 0, 3).fill_(neg_inf);
  auto padded = attention(q_last, pad_k, pad_v, pad_bias, group, attention_kernel::invariant);
  EXPECT_TRUE(at::equal(padded, expected));
}
