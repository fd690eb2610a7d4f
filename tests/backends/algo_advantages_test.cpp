#include "backends/algo/advantages.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/algo/common.hpp"
#include "backends/algo/reductions.hpp"
#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using namespace rlforge::backends::algo;

namespace {

void expect_rows(const at::Tensor& t, const std::vector<std::vector<double>>& want) {
  ASSERT_EQ(t.size(0), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      expect_close(v(t, i, j), want[i][j]);
}

// (x - mean)·rsqrt(var + 1e-8) over the masked entries, var with Bessel's correction.
std::vector<std::vector<double>> whiten(const std::vector<std::vector<double>>& x,
                                        const std::vector<std::vector<double>>& m) {
  double n = 0, sum = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) {
      n += m[i][j];
      sum += x[i][j] * m[i][j];
    }
  const double mean = sum / n;
  double ss = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j)
      ss += (x[i][j] - mean) * (x[i][j] - mean) * m[i][j];
  const double var = ss / n * n / (n - 1);
  auto out = x;
  for (auto& row : out)
    for (double& e : row)
      e = (e - mean) / std::sqrt(var + 1e-8);
  return out;
}

// Scores 1, 0 (group 0) and 2, 4 (group 1), rewards spread over tokens, padding masked.
advantage_inputs two_groups() {
  advantage_inputs in;
  in.rewards = t2({{0, 0, 1}, {0, 0, 0}, {0, 2, 0}, {1, 1, 2}});
  in.response_mask = t2({{1, 1, 1}, {1, 1, 0}, {1, 1, 0}, {1, 1, 1}});
  in.group_ids = {0, 0, 1, 1};
  return in;
}

} // namespace

TEST(AlgoAdvantages, GrpoNormalisesPerGroupWithUnbiasedStd) {
  auto in = two_groups();
  auto out = compute_advantages("grpo", in);
  const double s0 = std::sqrt(0.5), s1 = std::sqrt(2.0); // unbiased std of {1,0} and {2,4}
  const double a0 = 0.5 / (s0 + 1e-6), a1 = 1.0 / (s1 + 1e-6);
  expect_rows(out.advantages, {{a0, a0, a0}, {-a0, -a0, 0}, {-a1, -a1, 0}, {a1, a1, a1}});
  expect_rows(out.returns, {{a0, a0, a0}, {-a0, -a0, 0}, {-a1, -a1, 0}, {a1, a1, a1}});
  advantage_config no_std;
  no_std.norm_by_std = false;
  auto dr = compute_advantages("grpo", in, no_std);
  expect_rows(dr.advantages, {{0.5, 0.5, 0.5}, {-0.5, -0.5, 0}, {-1, -1, 0}, {1, 1, 1}});
  // Groups need not be adjacent: {1, 2} and {0, 4}.
  in.group_ids = {7, 3, 7, 3};
  auto mixed = compute_advantages("grpo", in, no_std);
  expect_rows(mixed.advantages, {{-0.5, -0.5, -0.5}, {-2, -2, 0}, {0.5, 0.5, 0}, {2, 2, 2}});
  // The default estimator is grpo.
  EXPECT_EQ(advantage_estimator_names().front(), "grpo");
}

TEST(AlgoAdvantages, GrpoSingleSampleGroupUsesZeroMeanUnitStd) {
  advantage_inputs in;
  in.rewards = t2({{0, 3}, {1, 0}, {0, 2}});
  in.response_mask = t2({{1, 1}, {1, 0}, {1, 1}});
  in.group_ids = {5, 6, 6};
  auto out = compute_advantages("grpo", in);
  const double single = 3.0 / (1.0 + 1e-6);
  const double pair = 0.5 / (std::sqrt(0.5) + 1e-6); // {1, 2}: μ 1.5
  expect_rows(out.advantages, {{single, single}, {-pair, 0}, {pair, pair}});
  advantage_config no_std;
  no_std.norm_by_std = false;
  expect_rows(compute_advantages("grpo", in, no_std).advantages, {{3, 3}, {-0.5, 0}, {0.5, 0.5}});
  // Equal scores in a group: σ = 0, advantage 0 (no division by zero).
  in.rewards = t2({{0, 3}, {1, 0}, {0, 1}});
  expect_rows(compute_advantages("grpo", in).advantages, {{single, single}, {0, 0}, {0, 0}});
}

TEST(AlgoAdvantages, RlooSubtractsTheMeanOfTheOthers) {
  advantage_inputs in;
  in.rewards = t2({{1, 0}, {2, 0}, {0, 6}, {0, 9}});
  in.response_mask = t2({{1, 1}, {1, 0}, {1, 1}, {1, 1}});
  in.group_ids = {0, 0, 0, 1};
  auto out = compute_advantages("rloo", in);
  // 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - 1.5 = 4.5; the single sample gets 0.
  expect_rows(out.advantages, {{-3, -3}, {-1.5, 0}, {4.5, 4.5}, {0, 0}});
  expect_rows(out.returns, {{-3, -3}, {-1.5, 0}, {4.5, 4.5}, {0, 0}});
}

TEST(AlgoAdvantages, MaxRlNormalisesByTheGroupMean) {
  advantage_inputs in;
  in.rewards = t2({{0, 1}, {0, 3}, {5, 0}});
  in.response_mask = t2({{1, 1}, {1, 1}, {1, 0}});
  in.group_ids = {0, 0, 1};
  auto out = compute_advantages("maxrl", in);
  const double a = 1.0 / (2.0 + 1e-6);
  expect_rows(out.advantages, {{-a, -a}, {a, a}, {5, 0}});
  advantage_config eps;
  eps.epsilon = 0.5;
  expect_rows(compute_advantages("maxrl", in, eps).advantages, {{-0.4, -0.4}, {0.4, 0.4}, {5, 0}});
}

// γ = 0.5. Row 0 (no padding): 0.25, 0.5, 1. Row 1 has a padding reward of 5 at t = 2: its
// return is stored (5) but the running sum is reset before t = 1, so t = 1 starts afresh at 1.
TEST(AlgoAdvantages, ReinforcePlusPlusResetsTheReturnAfterEos) {
  advantage_inputs in;
  in.rewards = t2({{0, 0, 1}, {0, 1, 5}});
  in.response_mask = t2({{1, 1, 1}, {1, 1, 0}});
  advantage_config cfg;
  cfg.gamma = 0.5;
  auto out = compute_advantages("reinforce++", in, cfg);
  const std::vector<std::vector<double>> returns = {{0.25, 0.5, 1}, {0.5, 1, 5}};
  const std::vector<std::vector<double>> mask = {{1, 1, 1}, {1, 1, 0}};
  expect_rows(out.returns, returns);
  auto w = whiten(returns, mask);
  w[1][2] = 0; // advantages are masked
  expect_rows(out.advantages, w);
}

// γ = 0.9, λ = 0.8, V = 0.5 .. 0.8, reward 1 at the end:
//   δ3 = 1 - 0.8 = 0.2                  A3 = 0.2
//   δ2 = 0.9·0.8 - 0.7 = 0.02           A2 = 0.02 + 0.72·0.2     = 0.164
//   δ1 = 0.9·0.7 - 0.6 = 0.03           A1 = 0.03 + 0.72·0.164   = 0.14808
//   δ0 = 0.9·0.6 - 0.5 = 0.04           A0 = 0.04 + 0.72·0.14808 = 0.1466176
TEST(AlgoAdvantages, GaeOnAFourStepTrajectory) {
  advantage_inputs in;
  in.rewards = t2({{0, 0, 0, 1}});
  in.values = t2({{0.5, 0.6, 0.7, 0.8}});
  in.response_mask = t2({{1, 1, 1, 1}});
  advantage_config cfg;
  cfg.gamma = 0.9;
  cfg.lambd = 0.8;
  auto out = compute_advantages("gae", in, cfg);
  const std::vector<double> adv = {0.1466176, 0.14808, 0.164, 0.2};
  const std::vector<double> v_ = {0.5, 0.6, 0.7, 0.8};
  expect_rows(out.returns, {{adv[0] + v_[0], adv[1] + v_[1], adv[2] + v_[2], adv[3] + v_[3]}});
  expect_rows(out.advantages, whiten({adv}, {{1, 1, 1, 1}}));
  // γ = λ = 1 (defaults): A_t = Σ_{k≥t} r_k - V_t = 0.5, 0.4, 0.3, 0.2; returns all 1.
  auto d = compute_advantages("gae", in);
  expect_rows(d.returns, {{1, 1, 1, 1}});
  expect_rows(d.advantages, whiten({{0.5, 0.4, 0.3, 0.2}}, {{1, 1, 1, 1}}));
}

TEST(AlgoAdvantages, MaskedWhitenUsesTheMaskedUnbiasedVariance) {
  auto x = t2({{1, 2, 3, 10}});
  auto m = t2({{1, 1, 1, 0}});
  // mean 2, unbiased variance (1 + 0 + 1) / 2 = 1.
  const double s = 1.0 / std::sqrt(1.0 + 1e-8);
  expect_rows(masked_whiten(x, m), {{-s, 0, s, 8 * s}});
  expect_error([&] { masked_whiten(x, t2({{0, 1, 0, 0}})); }, {"masked_whiten", "1"});
  expect_close(masked_mean(x, m).item<double>(), 2.0);
  expect_close(masked_mean(x, t2({{0, 0, 0, 0}})).item<double>(), 0.0);
  expect_close(masked_row_mean(x, m)[0].item<double>(), 2.0);
  expect_error([&] { masked_mean(x, t2({{1, 1}})); }, {"'mask'", "[1, 2]", "[1, 4]"});
  expect_error([&] { masked_row_mean(x, t2({{1, 1}})); }, {"'mask'", "[1, 2]"});
  expect_error([&] { masked_whiten(x, t2({{1, 1}})); }, {"'mask'", "[1, 2]"});
  expect_error([&] { masked_whiten(x, at::Tensor()); }, {"masked_whiten"});
  expect_error([&] { masked_mean(at::Tensor(), m); }, {"masked_mean"});
  expect_error([&] { masked_row_mean(at::zeros({}), at::Tensor()); }, {"masked_row_mean"});
}

TEST(AlgoAdvantages, GroupIdsFromTensor) {
  EXPECT_EQ(group_ids_from_tensor(at::tensor({3, 1, 3}, at::kInt)),
            (std::vector<int64_t>{3, 1, 3}));
  expect_error([] { group_ids_from_tensor(at::ones({2}, at::kFloat)); }, {"integer", "Float"});
  expect_error([] { group_ids_from_tensor(at::ones({2, 2}, at::kLong)); }, {"1-D", "[2, 2]"});
  expect_error([] { group_ids_from_tensor(at::Tensor()); }, {"1-D"});
}

TEST(AlgoAdvantages, BadInputsAreRejected) {
  auto in = two_groups();
  expect_error([&] { compute_advantages("ppo", in); }, {"'ppo'", "grpo, rloo, reinforce++"});
  auto no_ids = in;
  no_ids.group_ids = {0, 0, 1};
  expect_error([&] { compute_advantages("grpo", no_ids); }, {"3 ids", "4 rows"});
  expect_error(
      [&] {
        compute_advantages("rloo", advantage_inputs{in.rewards, in.response_mask, {}, {}});
      },
      {"0 ids"});
  expect_error([&] { compute_advantages("gae", in); }, {"gae", "'values'"});
  auto bad_values = in;
  bad_values.values = t2({{1, 2}});
  expect_error([&] { compute_advantages("gae", bad_values); }, {"'values'", "[1, 2]", "[4, 3]"});
  auto bad_mask = in;
  bad_mask.response_mask = t2({{1, 1, 1}});
  expect_error([&] { compute_advantages("grpo", bad_mask); }, {"'response_mask'", "[1, 3]"});
  auto nan_r = in;
  nan_r.rewards = t2({{nan_v, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}});
  expect_error([&] { compute_advantages("grpo", nan_r); }, {"'rewards'", "NaN"});
  auto no_rewards = in;
  no_rewards.rewards = at::Tensor();
  expect_error([&] { compute_advantages("grpo", no_rewards); }, {"'rewards'"});
  advantage_config g;
  g.gamma = 1.5;
  expect_error([&] { compute_advantages("reinforce++", in, g); }, {"gamma", "1.5"});
  advantage_config l;
  l.lambd = nan_v;
  expect_error([&] { compute_advantages("gae", in, l); }, {"lambd", "nan"});
  advantage_config e;
  e.epsilon = 0;
  expect_error([&] { compute_advantages("grpo", in, e); }, {"epsilon", "0"});
  // Whitening needs two valid tokens.
  advantage_inputs one;
  one.rewards = t2({{1, 0}});
  one.response_mask = t2({{1, 0}});
  expect_error([&] { compute_advantages("reinforce++", one); }, {"masked_whiten"});
  // maxrl with μ + ε = 0.
  advantage_inputs zero;
  zero.rewards = t2({{-1e-6}, {-1e-6}});
  zero.response_mask = t2({{1}, {1}});
  zero.group_ids = {4, 4};
  advantage_config tiny;
  tiny.epsilon = static_cast<double>(static_cast<float>(1e-6)); // matches the fp32 scores
  expect_error([&] { compute_advantages("maxrl", zero, tiny); }, {"maxrl", "group 4"});
}

// A = [[1,2,3],[4,5,6]], m = [[1,1,0],[1,0,0]] (3 valid tokens, row sums 2 and 1).
TEST(AlgoReductions, ScaleAdvantagesOnATwoByThreeExample) {
  auto a = t2({{1, 2, 3}, {4, 5, 6}});
  auto m = t2({{1, 1, 0}, {1, 0, 0}});
  expect_rows(scale_advantages(a, m), {{1. / 3, 2. / 3, 1}, {4. / 3, 5. / 3, 2}});
  expect_rows(scale_advantages(a, m, "sequence_mean"),
              {{1. / 4, 2. / 4, 3. / 4}, {4. / 2, 5. / 2, 6. / 2}});
  expect_rows(scale_advantages(a, m, "seq_mean_token_sum_norm", {}, 4),
              {{1. / 8, 2. / 8, 3. / 8}, {4. / 8, 5. / 8, 6. / 8}});
  // One prompt: same as token_mean. Two prompts: 1 / (2 · tokens of the row's group).
  expect_rows(scale_advantages(a, m, "prompt_mean", {9, 9}),
              {{1. / 3, 2. / 3, 1}, {4. / 3, 5. / 3, 2}});
  expect_rows(scale_advantages(a, m, "prompt_mean", {0, 1}),
              {{1. / 4, 2. / 4, 3. / 4}, {4. / 2, 5. / 2, 6. / 2}});
  // An all-padding row counts in B but its tokens are 0 (clamped to 1).
  auto m2 = t2({{1, 1, 0}, {0, 0, 0}});
  expect_rows(scale_advantages(a, m2, "sequence_mean"),
              {{1. / 4, 2. / 4, 3. / 4}, {4. / 2, 5. / 2, 6. / 2}});
  EXPECT_EQ(loss_reduction_names().front(), "token_mean");
}

// The masked sum of scaled per-token values equals the mean the reduction promises.
TEST(AlgoReductions, MaskedSumOfScaledValuesIsTheIntendedMean) {
  auto x = t2({{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}});
  auto m = t2({{1, 1, 1, 0}, {1, 0, 0, 0}, {1, 1, 0, 0}});
  auto sum = [&](const at::Tensor& s) { return (s * m).sum().item<double>(); };
  expect_close(sum(scale_advantages(x, m, "token_mean")), (1 + 2 + 3 + 5 + 9 + 10) / 6.0);
  expect_close(sum(scale_advantages(x, m, "sequence_mean")), (2.0 + 5.0 + 9.5) / 3.0);
  // Prompt groups {0, 2} (non-adjacent) and {1}: token means 25/5 and 5, averaged.
  expect_close(sum(scale_advantages(x, m, "prompt_mean", {0, 1, 0})), (25.0 / 5 + 5.0) / 2);
  expect_close(sum(scale_advantages(x, m, "seq_mean_token_sum_norm", {}, 4)),
               ((6.0 + 5.0 + 19.0) / 4) / 3);
}

TEST(AlgoReductions, BadInputsAreRejected) {
  auto a = t2({{1, 2, 3}});
  auto m = t2({{1, 1, 0}});
  expect_error([&] { scale_advantages(a, m, "mean"); }, {"'mean'", "token_mean", "prompt_mean"});
  expect_error([&] { scale_advantages(a, m, "prompt_mean"); }, {"0 ids", "1 rows"});
  expect_error([&] { scale_advantages(a, m, "seq_mean_token_sum_norm"); }, {"max_seq_len", "0"});
  expect_error([&] { scale_advantages(a, m, "seq_mean_token_sum_norm", {}, -3); }, {"-3"});
  expect_error([&] { scale_advantages(a, t2({{1, 1}})); }, {"'loss_mask'", "[1, 2]", "[1, 3]"});
  expect_error([&] { scale_advantages(t2({{nan_v, 0, 0}}), m); }, {"'advantages'", "NaN"});
  expect_error([&] { scale_advantages(a, t2({{1, -1, 0}})); }, {"negative"});
  expect_error([&] { scale_advantages(at::zeros({3}), m); }, {"'advantages'", "2-D"});
}
