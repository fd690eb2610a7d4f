#include "backends/algo/kl.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using namespace rlforge::backends::algo;

namespace {

double k3(double delta) { // delta = logp - ref
  double d = std::clamp(-delta, -20.0, 20.0);
  return std::clamp(std::exp(d) - d - 1.0, -10.0, 10.0);
}

} // namespace

// Δ = logp - ref = 0.5, -0.5, -1.5, -30 (the last saturates k3's clamps).
TEST(AlgoKl, EstimatorsOnGivenDeltas) {
  auto ref = t2({{-0.5, -0.5, -0.5, -0.5}});
  auto logp = t2({{0.0, -1.0, -2.0, -30.5}});
  const double delta[4] = {0.5, -0.5, -1.5, -30.0};
  auto k1_t = approx_kl(logp, ref, "k1");
  auto abs_t = approx_kl(logp, ref, "abs");
  auto k2_t = approx_kl(logp, ref, "k2");
  auto k3_t = approx_kl(logp, ref); // default k3
  for (int j = 0; j < 4; ++j) {
    expect_close(v(k1_t, 0, j), delta[j]);
    expect_close(v(abs_t, 0, j), std::abs(delta[j]));
    expect_close(v(k2_t, 0, j), 0.5 * delta[j] * delta[j]);
    expect_close(v(k3_t, 0, j), k3(delta[j]));
  }
  // e^0.5 - 0.5 - 1 for Δ = -0.5 (d = 0.5), written out.
  expect_close(v(k3_t, 0, 1), std::exp(0.5) - 1.5);
  EXPECT_EQ(v(k3_t, 0, 3), 10.0); // exp(20) - 21 clamped to 10
  EXPECT_EQ(kl_estimator_names(), (std::vector<std::string>{"k1", "k2", "k3", "abs"}));
}

TEST(AlgoKl, MaskZeroesMaskedTokens) {
  auto kl = approx_kl(t2({{0.0, -3.0}}), t2({{-1.0, -1.0}}), "k1", t2({{1, 0}}));
  expect_close(v(kl, 0, 0), 1.0);
  EXPECT_EQ(v(kl, 0, 1), 0.0);
}

// Row 0: k1 = 1, 3 (both valid) → mean 2; row 1: 0.5 valid, 7 masked → 0.5; row 2 is padding
// (mask 0) → 0 and still counts as a row: (2 + 0.5 + 0) / 3.
TEST(AlgoKl, KlLossIsCoefTimesMeanOverRowsOfMaskedRowMeans) {
  auto ref = t2({{0, 0}, {0, 0}, {0, 0}});
  auto logp = t2({{1, 3}, {0.5, 7}, {4, 4}}).requires_grad_(true);
  auto mask = t2({{1, 1}, {1, 0}, {0, 0}});
  auto out = kl_loss(logp, ref, mask, "k1", 0.1);
  expect_close(out.kl.item<double>(), 2.5 / 3.0);
  expect_close(out.loss.item<double>(), 0.1 * 2.5 / 3.0);
  out.loss.backward();
  // d/dlogp = coef / (B · Σ_t m_i) per valid token.
  expect_close(v(logp.grad(), 0, 0), 0.1 / (3 * 2));
  expect_close(v(logp.grad(), 1, 0), 0.1 / (3 * 1));
  EXPECT_EQ(v(logp.grad(), 1, 1), 0.0);
  EXPECT_EQ(v(logp.grad(), 2, 0), 0.0);
  // Default coefficient 0.001 and estimator k3.
  auto d = kl_loss(logp.detach(), ref, mask);
  const double want = (0.5 * (k3(1) + k3(3)) + k3(0.5)) / 3.0;
  expect_close(d.kl.item<double>(), want);
  expect_close(d.loss.item<double>(), 0.001 * want);
}

// d k3 / d logp = 1 - exp(ref - logp).
TEST(AlgoKl, K3GradientMatchesTheClosedForm) {
  auto ref = t2({{-1.0, -2.0}});
  auto logp = t2({{-1.5, -1.0}}).requires_grad_(true);
  approx_kl(logp, ref).sum().backward();
  expect_close(v(logp.grad(), 0, 0), 1 - std::exp(0.5));
  expect_close(v(logp.grad(), 0, 1), 1 - std::exp(-1.0));
}

TEST(AlgoKl, EntropyBonusAndRegularizersAddToTheLoss) {
  auto entropy = t2({{1.0, 2.0}, {3.0, 9.0}}).requires_grad_(true);
  auto mask = t2({{1, 1}, {1, 0}});
  auto bonus = entropy_bonus(entropy, mask);
  expect_close(bonus.item<double>(), 0.01 * 2.0); // (1 + 2 + 3) / 3
  bonus.backward();
  expect_close(v(entropy.grad(), 0, 0), 0.01 / 3);
  EXPECT_EQ(v(entropy.grad(), 1, 1), 0.0);

  loss_inputs in;
  in.logprobs = t2({{-1.0, -2.0}, {-1.0, -1.0}});
  in.ref_logprobs = t2({{-1.5, -2.0}, {-1.0, -4.0}});
  in.old_logprobs = in.logprobs;
  in.advantages = t2({{1, 1}, {1, 1}});
  in.loss_mask = mask;
  in.entropy = entropy.detach();
  auto out = compute_loss("regular", in);
  const double policy = out.loss.item<double>();
  regularizer_config rc;
  rc.use_kl_loss = true;
  rc.kl_estimator = "k1";
  rc.kl_loss_coef = 0.5;
  rc.use_entropy_loss = true;
  rc.entropy_loss_coef = 0.1;
  apply_regularizers(out, in, rc);
  const double kl = (0.5 * (0.5 + 0.0) + 0.0) / 2.0; // row means 0.25 and 0 (masked 3.0)
  expect_close(out.metrics.at("kl:mean"), kl);
  expect_close(out.metrics.at("kl_loss:mean"), 0.5 * kl);
  expect_close(out.metrics.at("entropy_loss:mean"), 0.1 * 2.0);
  expect_close(out.loss.item<double>(), policy + 0.5 * kl - 0.1 * 2.0);
  expect_close(out.metrics.at("total_loss:sum"), policy + 0.5 * kl - 0.1 * 2.0);
  expect_close(out.metrics.at("loss:sum"), policy); // the policy part alone

  // Off by default: nothing changes.
  auto plain = compute_loss("regular", in);
  apply_regularizers(plain, in, regularizer_config{});
  expect_close(plain.loss.item<double>(), policy);
  EXPECT_EQ(plain.metrics.count("kl:mean"), 0u);

  auto no_ref = in;
  no_ref.ref_logprobs = at::Tensor();
  auto o2 = compute_loss("regular", no_ref);
  expect_error([&] { apply_regularizers(o2, no_ref, rc); }, {"'ref_logprobs'"});
  regularizer_config ent_only;
  ent_only.use_entropy_loss = true;
  auto no_ent = in;
  no_ent.entropy = at::Tensor();
  expect_error([&] { apply_regularizers(o2, no_ent, ent_only); }, {"'entropy'"});
  loss_output empty;
  expect_error([&] { apply_regularizers(empty, in, rc); }, {"no loss"});
}

TEST(AlgoKl, AdaptiveControllerUpdateIsClippedProportional) {
  auto c = kl_controller::adaptive(0.001);
  EXPECT_TRUE(c.is_adaptive());
  // kl/target - 1 = 0.5 → clipped to 0.2; × 1000/10000 → ×1.02.
  c.update(0.15, 1000);
  expect_close(c.value(), 0.001 * 1.02, 1e-12);
  // 0.09/0.1 - 1 = -0.1 (inside the clip); × 500/10000 → ×0.995.
  c.update(0.09, 500);
  expect_close(c.value(), 0.001 * 1.02 * 0.995, 1e-12);
  // Far below target: clipped at -0.2.
  c.update(0.0, 10000);
  expect_close(c.value(), 0.001 * 1.02 * 0.995 * 0.8, 1e-12);
  auto custom = kl_controller::adaptive(0.5, 0.2, 100);
  custom.update(0.22, 10); // 0.22/0.2 - 1 = 0.1 → ×(1 + 0.1·0.1)
  expect_close(custom.value(), 0.5 * 1.01, 1e-12);
  auto f = kl_controller::fixed(0.3);
  EXPECT_FALSE(f.is_adaptive());
  f.update(5.0, 1000);
  EXPECT_EQ(f.value(), 0.3);
}

TEST(AlgoKl, KlInRewardSubtractsCoefTimesKlAndFeedsTheController) {
  auto rewards = t2({{0.0, 1.0}, {0.0, 2.0}});
  auto logp = t2({{-1.0, -1.0}, {-2.0, -1.0}});
  auto ref = t2({{-1.5, -1.0}, {-1.0, -1.0}});
  auto mask = t2({{1, 1}, {1, 0}});
  auto ctl = kl_controller::adaptive(0.2, 0.1, 10);
  auto out = apply_kl_to_rewards(rewards, logp, ref, mask, ctl, "k1");
  // k1 = 0.5, 0 / -1, 0(masked).
  expect_close(v(out.rewards, 0, 0), -0.2 * 0.5);
  expect_close(v(out.rewards, 0, 1), 1.0);
  expect_close(v(out.rewards, 1, 0), 0.2);
  expect_close(v(out.rewards, 1, 1), 2.0);
  expect_close(out.avg_kl, (0.25 + -1.0) / 2);
  expect_close(out.avg_kl_max, (0.5 + 1.0) / 2);
  EXPECT_EQ(out.coef, 0.2);
  // avg_kl = -0.375: error clipped to -0.2, n_steps = B = 2, horizon 10 → ×0.96.
  expect_close(ctl.value(), 0.2 * 0.96, 1e-12);
  // A negative coefficient is used as 0.
  auto neg = kl_controller::fixed(-1.0);
  auto z = apply_kl_to_rewards(rewards, logp, ref, mask, neg, "k1");
  EXPECT_EQ(z.coef, 0.0);
  expect_close(v(z.rewards, 1, 0), 0.0);
}

TEST(AlgoKl, BadInputsAreRejected) {
  auto a = t2({{0.0, 0.0}});
  expect_error([&] { approx_kl(a, a, "k4"); }, {"'k4'", "k1, k2, k3, abs"});
  expect_error([&] { approx_kl(a, t2({{0.0}})); }, {"'ref_logprobs'", "[1, 1]", "[1, 2]"});
  expect_error([&] { approx_kl(a, a, "k3", t2({{1.0}})); }, {"'loss_mask'", "[1, 1]"});
  expect_error([&] { approx_kl(t2({{nan_v, 0.0}}), a); }, {"'logprobs'", "NaN"});
  expect_error([&] { approx_kl(a, t2({{-inf, 0.0}})); }, {"'ref_logprobs'"});
  expect_error([&] { approx_kl(at::zeros({2}), at::zeros({2})); }, {"'logprobs'", "2-D"});
  expect_error([&] { kl_loss(a, a, a, "k3", -0.1); }, {"kl_loss_coef", "-0.1"});
  expect_error([&] { kl_loss(a, a, a, "k3", nan_v); }, {"kl_loss_coef", "nan"});
  expect_error([&] { entropy_bonus(a, a, inf); }, {"entropy_loss_coef", "inf"});
  expect_error([&] { entropy_bonus(t2({{1.0}}), a); }, {"'loss_mask'"});
  expect_error([] { kl_controller::adaptive(0.1, 0.0); }, {"kl_target", "0"});
  expect_error([] { kl_controller::adaptive(0.1, 0.1, 0); }, {"horizon", "0"});
  expect_error([] { kl_controller::adaptive(nan_v); }, {"kl_loss_coef", "nan"});
  expect_error([] { kl_controller::fixed(inf); }, {"kl_loss_coef", "inf"});
  auto c = kl_controller::adaptive(0.1);
  expect_error([&] { c.update(nan_v, 1); }, {"nan"});
  expect_error([&] { c.update(0.1, -1); }, {"n_steps", "-1"});
  expect_error([&] { apply_kl_to_rewards(t2({{0.0}}), a, a, a, c); },
               {"'logprobs'", "[1, 2]", "[1, 1]"});
  expect_error([&] { apply_kl_to_rewards(t2({{nan_v, 0.0}}), a, a, a, c); }, {"'rewards'"});
}
