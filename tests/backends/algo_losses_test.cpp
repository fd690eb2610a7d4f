// The losses' math (backends/algo/losses.hpp) on cases computed by hand: every policy loss, the
// PPO critic, Clip-Cov and KL-Cov, ratio metrics and negative weights.
#include "backends/algo/losses.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "algo_loss_support.hpp"
#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using namespace rlforge::backends::algo;

// ratios 0.5 / 1 / 1.5 against A = +2 (row 0) and A = -2 (row 1), eps 0.2:
//   A = +2: -min(rA, clip(r)A) = -min(1.0, 1.6), -2, -min(3.0, 2.4)  = -1.0, -2.0, -2.4 (clipped)
//   A = -2: -min(-1.0, -1.6), 2, -min(-3.0, -2.4)                    =  1.6 (clipped), 2.0, 3.0
TEST(AlgoLosses, RegularClipsOnlyTheSideThatHelpsTheObjective) {
  auto old = t2({{-1.0, -1.0, -1.0}, {-0.5, -0.5, -0.5}});
  auto logp = logp_for(old, {{0.5, 1.0, 1.5}, {0.5, 1.0, 1.5}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{2, 2, 2}, {-2, -2, -2}});
  auto out = compute_loss("regular", in);
  const double want[2][3] = {{-1.0, -2.0, -2.4}, {1.6, 2.0, 3.0}};
  double sum = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      expect_close(v(out.elementwise, i, j), want[i][j]);
      sum += want[i][j];
    }
  expect_close(out.loss.item<double>(), sum);
  expect_close(out.metrics.at("loss:sum"), sum);
  expect_close(out.metrics.at("clip_ratio:mean"), 2.0 / 6.0);

  // Gradient w.r.t. logp: -A·r where the unclipped term is active, 0 where clipped.
  auto g = grad_of(out, logp);
  const double want_g[2][3] = {{-2 * 0.5, -2 * 1.0, 0.0}, {0.0, 2 * 1.0, 2 * 1.5}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      expect_close(v(g, i, j), want_g[i][j]);
}

TEST(AlgoLosses, RegularHonoursAsymmetricEpsilonsAndTheMask) {
  auto old = t2({{0.0, 0.0, 0.0}});
  auto logp = logp_for(old, {{0.5, 1.5, 1.5}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{-1, 1, 1}});
  in.loss_mask = t2({{1, 1, 0}});
  // eps_low 0.3 → lower bound 0.7: -min(-0.5, -0.7) = 0.7; eps_high 0.4 → 1.4: -min(1.5, 1.4).
  auto out = compute_loss("regular", in, values({{"eps_clip_low", 0.3}, {"eps_clip_high", 0.4}}));
  expect_close(v(out.elementwise, 0, 0), 0.7);
  expect_close(v(out.elementwise, 0, 1), -1.4);
  EXPECT_EQ(v(out.elementwise, 0, 2), 0.0);
  expect_close(out.loss.item<double>(), 0.7 - 1.4);
  expect_close(out.metrics.at("clip_ratio:mean"), 1.0); // both valid tokens clipped
  EXPECT_EQ(v(out.loss_mask, 0, 2), 0.0);
}

// A < 0 with ratios 0.5 / 1 / 10 and c = 3: regular gives 0.8, 1, 10; the cap -A·c = 3 bites
// only for r = 10. A > 0 rows are untouched (r = 10, A = 1: -1.2).
TEST(AlgoLosses, DualClipCapsNegativeAdvantageLossAtCTimesAbsA) {
  auto old = t2({{-2, -2, -2}, {-2, -2, -2}});
  auto logp = logp_for(old, {{0.5, 1.0, 10.0}, {10.0, 10.0, 10.0}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{-1, -1, -1}, {1, 1, 1}});
  auto out = compute_loss("dual_clip", in);
  expect_close(v(out.elementwise, 0, 0), 0.8);
  expect_close(v(out.elementwise, 0, 1), 1.0);
  expect_close(v(out.elementwise, 0, 2), 3.0);
  for (int j = 0; j < 3; ++j)
    expect_close(v(out.elementwise, 1, j), -1.2);
  auto g = grad_of(out, logp);
  EXPECT_EQ(v(g, 0, 2), 0.0);    // the cap is a constant
  expect_close(v(g, 0, 1), 1.0); // -A·r
  // A custom c.
  auto out5 = compute_loss("dual_clip", in, values({{"clip_ratio_c", 5.0}}));
  expect_close(v(out5.elementwise, 0, 2), 5.0);
}

// Two sequences: s_0 = mean(0.1, 0.3) = 0.2 → w = e^0.2 = 1.2214 > 1.2 (A = 1: clipped to 1.2);
// s_1 = mean(-0.2, 0.0) = -0.1 (third token masked) → w = e^-0.1, A = -1: loss e^-0.1 per token.
TEST(AlgoLosses, GspoUsesTheSequenceMeanLogRatioForEveryToken) {
  auto old = t2({{-1.0, -1.0, -1.0}, {-1.0, -1.0, -1.0}});
  auto logp = (old + t2({{0.1, 0.3, 0.7}, {-0.2, 0.0, 5.0}})).detach().requires_grad_(true);
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{1, 1, 1}, {-1, -1, -1}});
  in.loss_mask = t2({{1, 1, 0}, {1, 1, 0}});
  auto out = compute_loss("gspo", in);
  const double w1 = std::exp(-0.1);
  expect_close(v(out.elementwise, 0, 0), -1.2);
  expect_close(v(out.elementwise, 0, 1), -1.2);
  expect_close(v(out.elementwise, 1, 0), w1);
  expect_close(v(out.elementwise, 1, 1), w1);
  expect_close(out.loss.item<double>(), -2.4 + 2 * w1);
  expect_close(out.metrics.at("clip_ratio:mean"), 0.5);
  // d/dlogp of -w·A with w = exp(logp - sg(logp) + sg(s)) is -w·A per token; clipped tokens 0.
  auto g = grad_of(out, logp);
  EXPECT_EQ(v(g, 0, 0), 0.0);
  expect_close(v(g, 1, 0), w1);
  expect_close(v(g, 1, 1), w1);
  EXPECT_EQ(v(g, 1, 2), 0.0);
}

TEST(AlgoLosses, GspoClampsTheLogWeightAtTen) {
  auto old = t2({{0.0}});
  loss_inputs in;
  in.logprobs = t2({{12.0}});
  in.old_logprobs = old;
  in.advantages = t2({{-1}});
  auto out = compute_loss("gspo", in);
  // A < 0: -min(-w, -clip(w)) = w = e^10 (not e^12).
  expect_close(out.loss.item<double>(), std::exp(10.0));
}

// gate(r, τ) = sigmoid(τ(r - 1))·4/τ, τ+ = 1 for A > 0, τ- = 1.05 otherwise.
TEST(AlgoLosses, SapoGatesUseTheTemperatureOfTheAdvantageSign) {
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  auto old = t2({{0.0, 0.0, 0.0}});
  auto logp = logp_for(old, {{1.5, 0.5, 1.0}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{2, -1, -3}});
  auto out = compute_loss("sapo", in);
  const double e0 = -sigmoid(1.0 * 0.5) * 4.0 / 1.0 * 2.0;
  const double e1 = sigmoid(1.05 * -0.5) * 4.0 / 1.05;
  const double e2 = sigmoid(0.0) * 4.0 / 1.05 * 3.0; // r = 1: gate = 2/τ
  expect_close(v(out.elementwise, 0, 0), e0);
  expect_close(v(out.elementwise, 0, 1), e1);
  expect_close(v(out.elementwise, 0, 2), e2);
  EXPECT_EQ(out.metrics.at("clip_ratio:mean"), 0.0);
  // Custom temperatures: τ+ = 2 → sigmoid(1)·2·A.
  auto out2 = compute_loss("sapo", in, values({{"tau_pos", 2.0}, {"tau_neg", 0.5}}));
  expect_close(v(out2.elementwise, 0, 0), -sigmoid(1.0) * 2.0 * 2.0);
  expect_close(v(out2.elementwise, 0, 1), sigmoid(-0.25) * 8.0);
}

// CISPO: loss = -A·sg(clip(r, 0, 5))·logp, so d loss / d logp = -A·clip(r) exactly.
TEST(AlgoLosses, CispoGradientIsMinusAdvantageTimesClippedRatio) {
  auto old = t2({{-1.0, -2.0, -3.0, -1.5}});
  auto logp = logp_for(old, {{0.5, 1.0, 7.0, 2.0}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{1, -2, 1, 0.5}});
  auto out = compute_loss("cispo", in);
  const double clipped[4] = {0.5, 1.0, 5.0, 2.0};
  const double a[4] = {1, -2, 1, 0.5};
  double sum = 0;
  for (int j = 0; j < 4; ++j)
    sum += -a[j] * clipped[j] * v(logp.detach(), 0, j);
  expect_close(out.loss.item<double>(), sum);
  expect_close(out.metrics.at("clip_ratio:mean"), 0.25);
  expect_close(out.metrics.at("cispo_ratio_max:max"), 7.0);
  expect_close(out.metrics.at("cispo_ratio_min:min"), 0.5);
  expect_close(out.metrics.at("cispo_ratio_mean:mean"), (0.5 + 1 + 7 + 2) / 4.0);
  expect_close(out.metrics.at("cispo_ratio_clamped_mean:mean"), (0.5 + 1 + 5 + 2) / 4.0);
  auto g = grad_of(out, logp);
  for (int j = 0; j < 4; ++j)
    expect_close(v(g, 0, j), -a[j] * clipped[j]);
}

TEST(AlgoLosses, CispoCustomBoundsAndRolloutAnchor) {
  auto old = t2({{0.0, 0.0}});
  auto roll = t2({{std::log(2.0), 0.0}});
  auto logp = logp_for(old, {{0.5, 3.0}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.rollout_logprobs = roll;
  in.advantages = t2({{1, 1}});
  // Bounds [0.8, 1.5]: clip(0.5) = 0.8, clip(3) = 1.5.
  auto out = compute_loss("cispo", in,
                          values({{"cispo_eps_clip_low", 0.2}, {"cispo_eps_clip_high", 0.5}}));
  auto g = grad_of(out, logp);
  expect_close(v(g, 0, 0), -0.8);
  expect_close(v(g, 0, 1), -1.5);
  // Anchored on rollout: r = [0.25, 3] against roll; defaults clip to [0, 5].
  auto logp2 = logp.detach().clone().requires_grad_(true);
  in.logprobs = logp2;
  loss_config c;
  c.options["cispo_anchor"] = "rollout";
  auto out2 = compute_loss("cispo", in, c);
  auto g2 = grad_of(out2, logp2);
  expect_close(v(g2, 0, 0), -0.25);
  expect_close(v(g2, 0, 1), -3.0);
}

// rollout_is: r vs rollout = 0.5 / 1.1 / 1.3; only 1.1 lies in (0.8, 1.2).
TEST(AlgoLosses, RolloutIsZeroesRatiosOutsideTheTrustInterval) {
  auto roll = t2({{-1.0, -1.0, -1.0}});
  auto logp = logp_for(roll, {{0.5, 1.1, 1.3}});
  loss_inputs in;
  in.logprobs = logp;
  in.rollout_logprobs = roll;
  in.advantages = t2({{2, 2, 2}});
  auto out = compute_loss("rollout_is", in);
  const double lp1 = v(logp.detach(), 0, 1);
  EXPECT_EQ(v(out.elementwise, 0, 0), 0.0);
  expect_close(v(out.elementwise, 0, 1), -1.1 * 2 * lp1);
  EXPECT_EQ(v(out.elementwise, 0, 2), 0.0);
  expect_close(out.metrics.at("clip_ratio:mean"), 2.0 / 3.0);
  auto g = grad_of(out, logp);
  EXPECT_EQ(v(g, 0, 0), 0.0);
  expect_close(v(g, 0, 1), -1.1 * 2);
  EXPECT_EQ(v(g, 0, 2), 0.0);
}

// DPPO binary TV with μ_p = 0.5 everywhere, δ = 0.2:
//   p = 0.8, A > 0: p - μ = 0.3 > 0.2 → dropped;  p = 0.6, A > 0: kept;
//   p = 0.2, A < 0: μ - p = 0.3 > 0.2 → dropped;  p = 0.8, A < 0: kept (only decreases count).
TEST(AlgoLosses, DppoMasksTokensWhoseProbabilityMovedTooFar) {
  const double mu = std::log(0.5);
  auto roll = t2({{mu, mu, mu, mu}});
  auto logp = t2({{std::log(0.8), std::log(0.6), std::log(0.2), std::log(0.8)}});
  loss_inputs in;
  in.logprobs = logp;
  in.rollout_logprobs = roll;
  in.advantages = t2({{1, 1, -1, -1}});
  auto out = compute_loss("dppo", in);
  EXPECT_EQ(v(out.elementwise, 0, 0), 0.0);
  expect_close(v(out.elementwise, 0, 1), -(0.6 / 0.5) * 1);
  EXPECT_EQ(v(out.elementwise, 0, 2), 0.0);
  expect_close(v(out.elementwise, 0, 3), (0.8 / 0.5) * 1);
  expect_close(out.metrics.at("clip_ratio:mean"), 0.5);
  // Without rollout log-probs μ is `old`; a larger δ keeps everything.
  in.rollout_logprobs = at::Tensor();
  in.old_logprobs = roll;
  auto wide = compute_loss("dppo", in, values({{"delta_low", 0.35}, {"delta_high", 0.35}}));
  expect_close(wide.loss.item<double>(), -(1.6 + 1.2) + (0.4 + 1.6));
  EXPECT_EQ(wide.metrics.at("clip_ratio:mean"), 0.0);
}

TEST(AlgoLosses, DppoBinaryKlUsesTheBernoulliDivergence) {
  const double mu_p = 0.5, delta = 0.05;
  auto bkl = [&](double p) {
    return mu_p * (std::log(mu_p) - std::log(p)) +
           (1 - mu_p) * std::log((1 - mu_p + 1e-8) / (1 - p + 1e-8));
  };
  // p = 0.7: KL ≈ 0.087 > 0.05 with A > 0 → dropped; p = 0.6: KL ≈ 0.020 → kept;
  // p = 0.3, A < 0: KL ≈ 0.087 → dropped.
  ASSERT_GT(bkl(0.7), delta);
  ASSERT_LT(bkl(0.6), delta);
  ASSERT_GT(bkl(0.3), delta);
  auto mu = t2({{std::log(mu_p), std::log(mu_p), std::log(mu_p)}});
  loss_inputs in;
  in.logprobs = t2({{std::log(0.7), std::log(0.6), std::log(0.3)}});
  in.rollout_logprobs = mu;
  in.advantages = t2({{1, 1, -1}});
  loss_config c = values({{"delta_low", delta}, {"delta_high", delta}});
  c.options["dppo_type"] = "binary_kl";
  auto out = compute_loss("dppo", in, c);
  EXPECT_EQ(v(out.elementwise, 0, 0), 0.0);
  expect_close(v(out.elementwise, 0, 1), -1.2);
  EXPECT_EQ(v(out.elementwise, 0, 2), 0.0);
}

TEST(AlgoLosses, DroIsLogLikelihoodMinusQuadraticPenalty) {
  auto old = t2({{-1.0, -2.0}});
  auto logp = t2({{-0.5, -2.5}}).requires_grad_(true);
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{2, -1}});
  auto out = compute_loss("dro", in, values({{"beta", 0.4}}));
  // -(logp·A - ½β(logp-old)²): -(-1 - 0.2·0.25) = 1.05; -(2.5 - 0.2·0.25) = -2.45.
  expect_close(v(out.elementwise, 0, 0), 1.05);
  expect_close(v(out.elementwise, 0, 1), -2.45);
  // d/dlogp = -A + β(logp - old) = -2 + 0.2, 1 - 0.2.
  auto g = grad_of(out, logp);
  expect_close(v(g, 0, 0), -1.8);
  expect_close(v(g, 0, 1), 0.8);
}

TEST(AlgoLosses, ImportanceSamplingIsUnclippedRatioTimesAdvantage) {
  auto old = t2({{0.0, 0.0, 0.0}});
  auto logp = logp_for(old, {{0.5, 3.0, 2.0}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{1, -1, 4}});
  in.loss_mask = t2({{1, 1, 0}});
  auto out = compute_loss("importance_sampling", in);
  expect_close(out.loss.item<double>(), -0.5 + 3.0);
  expect_close(out.metrics.at("importance_ratio:mean"), (0.5 + 3.0) / 2);
  EXPECT_EQ(out.metrics.count("clip_ratio:mean"), 0u);
  auto g = grad_of(out, logp);
  expect_close(v(g, 0, 0), -0.5);
  expect_close(v(g, 0, 1), 3.0);
  EXPECT_EQ(v(g, 0, 2), 0.0);
}

TEST(AlgoLosses, CrossEntropyIsMaskedNegativeLogLikelihood) {
  auto logp = t2({{-0.5, -1.5}, {-2.0, -3.0}}).requires_grad_(true);
  loss_inputs in;
  in.logprobs = logp;
  in.loss_mask = t2({{1, 0}, {1, 1}});
  auto out = compute_loss("cross_entropy", in);
  expect_close(out.loss.item<double>(), 0.5 + 2.0 + 3.0);
  EXPECT_EQ(v(out.elementwise, 0, 1), 0.0);
  expect_close(v(out.elementwise, 1, 1), 3.0);
  auto g = grad_of(out, logp);
  EXPECT_EQ(v(g, 0, 0), -1.0);
  EXPECT_EQ(v(g, 0, 1), 0.0);
  // Weights other than 0/1 scale the token (Tinker weights).
  in.loss_mask = t2({{0.5, 0}, {2, 0}});
  in.logprobs = logp.detach();
  expect_close(compute_loss("cross_entropy", in).loss.item<double>(), 0.25 + 4.0);
}

// V = 1.0 (old 0.5, R 1.5): V_c = 0.7, max(0.64, 0.25) = 0.64 → 0.32 (clipped; grad 0);
// V = 2.1 (old 2.0, R 1.0): V_c = 2.1, both 1.21 → 0.605 (grad V - R = 1.1).
TEST(AlgoLosses, PpoCriticTakesTheLargerOfClippedAndUnclippedError) {
  auto values_t = t2({{1.0, 2.1}}).requires_grad_(true);
  loss_inputs in;
  in.values = values_t;
  in.old_values = t2({{0.5, 2.0}});
  in.returns = t2({{1.5, 1.0}});
  auto out = compute_loss("ppo_critic", in);
  expect_close(v(out.elementwise, 0, 0), 0.32);
  expect_close(v(out.elementwise, 0, 1), 0.605);
  expect_close(out.loss.item<double>(), 0.925);
  expect_close(out.metrics.at("clipfrac:mean"), 0.5);
  auto g = grad_of(out, values_t);
  EXPECT_EQ(v(g, 0, 0), 0.0);
  expect_close(v(g, 0, 1), 1.1);
}

TEST(AlgoLosses, PpoCriticWithoutClippingIsHalfSquaredError) {
  loss_inputs in;
  in.values = t2({{1.0, 2.1}});
  in.returns = t2({{1.5, 1.0}});
  // No old values needed once clipping is off.
  auto out = compute_loss("ppo_critic", in, values({{"value_clip", inf}}));
  expect_close(out.loss.item<double>(), 0.125 + 0.605);
  EXPECT_EQ(out.metrics.count("clipfrac:mean"), 0u);
  loss_config none;
  none.options["value_clip"] = "none";
  expect_close(compute_loss("ppo_critic", in, none).loss.item<double>(), 0.125 + 0.605);
  // A wider clip that never binds equals the unclipped loss (values exact in binary).
  in.values = t2({{1.0, 2.5}});
  in.old_values = t2({{0.5, 2.0}});
  auto wide = compute_loss("ppo_critic", in, values({{"value_clip", 1.0}}));
  expect_close(wide.loss.item<double>(), 0.125 + 1.125);
  EXPECT_EQ(wide.metrics.at("clipfrac:mean"), 0.0);
}

namespace {

// Token covariances (A - Ā)(logp - mean logp) over valid tokens, written out in double.
std::vector<double> covariances(const std::vector<double>& a, const std::vector<double>& lp) {
  double ma = 0, ml = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ma += a[i];
    ml += lp[i];
  }
  ma /= a.size();
  ml /= lp.size();
  std::vector<double> c;
  for (size_t i = 0; i < a.size(); ++i)
    c.push_back((a[i] - ma) * (lp[i] - ml));
  return c;
}

} // namespace

// Five tokens, r = 1 except token 4 (r = 2, A = 3: PPO-clipped, so never a candidate even
// though its covariance lies inside the bounds).
TEST(AlgoLosses, ClipCovDropsHighCovarianceTokensDeterministically) {
  const std::vector<double> a = {2, 1, 0, -1.5, 3};
  const std::vector<double> old = {-1, -2, -3, -4, -2.5};
  const std::vector<double> lp = {-1, -2, -3, -4, -2.5 + std::log(2.0)};
  auto cov = covariances(a, lp);
  ASSERT_GT(cov[4], 1.0);
  ASSERT_LT(cov[4], 5.0);
  // Candidates: lb 1 < cov < ub 5 and not PPO-clipped (-A·clip(r) > -A·r only for token 4).
  std::vector<int> cand;
  for (int j = 0; j < 4; ++j)
    if (cov[j] > 1 && cov[j] < 5)
      cand.push_back(j);
  ASSERT_EQ(cand, (std::vector<int>{0, 3}));
  loss_inputs in;
  in.logprobs = t2({lp});
  in.old_logprobs = t2({old});
  in.advantages = t2({a});
  // Per-token max(-A·r, -A·clip(r)): -2, -1, 0, 1.5, max(-6, -3.6) = -3.6.
  // clip_ratio 0.5 of 5 tokens → budget 2 = all candidates: deterministic.
  auto out = compute_loss("clip_cov", in, values({{"clip_ratio", 0.5}}));
  EXPECT_EQ(v(out.elementwise, 0, 0), 0.0);
  EXPECT_EQ(v(out.elementwise, 0, 3), 0.0);
  expect_close(v(out.elementwise, 0, 4), -3.6);
  expect_close(out.loss.item<double>(), -1.0 + 0.0 - 3.6);
  // Metrics average over the loss mask's tokens, whatever their advantages: 2 of 5.
  expect_close(out.metrics.at("clip_ratio:mean"), 2.0 / 5.0);
  // Default clip_ratio → budget 1: one of the two is dropped, the same one for the same seed.
  auto one = compute_loss("clip_cov", in);
  const double l1 = one.loss.item<double>();
  const double drop0 = -1.0 + 0.0 + 1.5 - 3.6;
  const double drop3 = -2.0 - 1.0 + 0.0 - 3.6;
  EXPECT_TRUE(std::abs(l1 - drop0) < 1e-5 || std::abs(l1 - drop3) < 1e-5) << l1;
  EXPECT_EQ(compute_loss("clip_cov", in).loss.item<double>(), l1);
  expect_close(one.metrics.at("clip_ratio:mean"), 1.0 / 5.0);
  // Bounds that exclude every token: plain max(pg1, pg2).
  auto none = compute_loss("clip_cov", in, values({{"clip_cov_lb", 10.0}, {"clip_cov_ub", 20.0}}));
  expect_close(none.loss.item<double>(), -2 - 1 + 0 + 1.5 - 3.6);
  EXPECT_EQ(none.metrics.at("clip_ratio:mean"), 0.0);
}

// A Tinker RL datum carries placeholder log-probs 0 and advantages 0 at its prompt positions and
// often no weights; its batch marks the sampled positions in `metric_mask` (tinker_batch.hpp).
// The ratio metrics average over those, whatever the advantages' values: a batch that is exactly
// on-policy reports a ratio of 1 and no clipping, with all-zero advantages too.
TEST(AlgoLosses, RatioMetricsAverageOverTheMetricPositionsWhateverTheAdvantages) {
  // Two prompt positions (old = 0) and three sampled tokens (old = logp).
  const std::vector<double> lp = {-2.0, -3.0, -0.5, -1.25, -0.75};
  const std::vector<double> old = {0.0, 0.0, -0.5, -1.25, -0.75};
  loss_inputs in;
  in.logprobs = t2({lp});
  in.old_logprobs = t2({old});
  in.metric_mask = t2({{0.0, 0.0, 1.0, 1.0, 1.0}});
  for (const std::vector<double>& adv :
       {std::vector<double>{0.0, 0.0, 1.0, -1.0, 0.5}, std::vector<double>{0, 0, 0, 0, 0},
        std::vector<double>{2.0, -2.0, 0.0, 0.0, 3.0}}) {
    in.advantages = t2({adv});
    auto is = compute_loss("importance_sampling", in);
    expect_close(is.metrics.at("importance_ratio:mean"), 1.0);
    EXPECT_EQ(is.metric_weight, 3.0);
    EXPECT_EQ(compute_loss("regular", in).metrics.at("clip_ratio:mean"), 0.0);
  }
  in.entropy = t2({{9.0, 9.0, 1.0, 2.0, 3.0}});
  expect_close(compute_loss("regular", in).metrics.at("entropy:mean"), 2.0);
  // The loss mask narrows them further (and weighs them by |weight|).
  in.loss_mask = t2({{0.0, 0.0, 1.0, 1.0, 0.0}});
  expect_close(compute_loss("importance_sampling", in).metrics.at("importance_ratio:mean"), 1.0);
  EXPECT_EQ(compute_loss("importance_sampling", in).metric_weight, 2.0);
  // Without a metric mask the loss mask alone selects them: here every position, so the prompt
  // positions' ratios exp(-2) and exp(-3) count too.
  in.loss_mask = at::Tensor();
  in.metric_mask = at::Tensor();
  auto all = compute_loss("importance_sampling", in);
  EXPECT_EQ(all.metric_weight, 5.0);
  expect_close(all.metrics.at("importance_ratio:mean"), (std::exp(-2.0) + std::exp(-3.0) + 3) / 5);
}

// Tinker's weights may be negative (SDK 0.25's forward_backward_custom sends -dLoss/dlogprob):
// cross_entropy is then Σ -w·logp with the signs as given, and metrics weigh by |w|.
TEST(AlgoLosses, NegativeWeightsWeighTheLossWithTheirSign) {
  loss_inputs in;
  in.logprobs = t2({{-1.0, -2.0, -0.5}}).requires_grad_(true);
  in.loss_mask = t2({{0.5, -1.0, 0.0}});
  in.entropy = t2({{4.0, 1.0, 100.0}});
  auto out = compute_loss("cross_entropy", in);
  expect_close(out.loss.item<double>(), 0.5 * 1.0 + -1.0 * 2.0);
  out.loss.backward();
  EXPECT_EQ(v(in.logprobs.grad(), 0, 0), -0.5);
  EXPECT_EQ(v(in.logprobs.grad(), 0, 1), 1.0);
  EXPECT_EQ(v(in.logprobs.grad(), 0, 2), 0.0);
  EXPECT_EQ(out.metric_weight, 1.5);
  expect_close(out.metrics.at("entropy:mean"), (0.5 * 4.0 + 1.0 * 1.0) / 1.5);
}

TEST(AlgoLosses, KlCovPenalisesTheLargestCovarianceTokens) {
  const std::vector<double> a = {1, -1, 2, 0, 0.5};
  const std::vector<double> old = {-1, -1, -1, -1, -1};
  const std::vector<double> lp = {-0.8, -1.5, -0.2, -2.0, -1.1};
  auto cov = covariances(a, lp);
  const int top = static_cast<int>(std::max_element(cov.begin(), cov.end()) - cov.begin());
  loss_inputs in;
  in.logprobs = t2({lp});
  in.old_logprobs = t2({old});
  in.advantages = t2({a});
  // 5 tokens · 0.2 = 1 token gets + coef·|logp - old|.
  auto out = compute_loss("kl_cov", in, values({{"ppo_kl_coef", 2.0}}));
  double want = 0;
  for (int j = 0; j < 5; ++j) {
    double l = -a[j] * std::exp(lp[j] - old[j]);
    if (j == top)
      l += 2.0 * std::abs(lp[j] - old[j]);
    want += l;
    expect_close(v(out.elementwise, 0, j), l);
  }
  expect_close(out.loss.item<double>(), want);
  // kl_cov_frac 0.4 → the two largest.
  std::vector<int> order = {0, 1, 2, 3, 4};
  std::sort(order.begin(), order.end(), [&](int x, int y) { return cov[x] > cov[y]; });
  auto two = compute_loss("kl_cov", in, values({{"kl_cov_frac", 0.4}}));
  for (int j = 0; j < 5; ++j) {
    double l = -a[j] * std::exp(lp[j] - old[j]);
    if (j == order[0] || j == order[1])
      l += std::abs(lp[j] - old[j]);
    expect_close(v(two.elementwise, 0, j), l);
  }
}
