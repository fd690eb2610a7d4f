#include "backends/algo/off_policy.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/algo/losses.hpp"
#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using namespace rlforge::backends::algo;

namespace {

// old = 0 and roll = -log ρ, so exp(old - roll) = ρ.
struct ratios {
  at::Tensor old, roll;
};

ratios with_ratios(const std::vector<std::vector<double>>& rho) {
  auto r = t2(rho);
  return {at::zeros_like(r), -r.log()};
}

void expect_mask(const at::Tensor& mask, const std::vector<std::vector<double>>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      EXPECT_EQ(v(mask, i, j), want[i][j]) << i << "," << j;
}

} // namespace

TEST(AlgoOffPolicy, DisabledByDefaultLeavesTheMaskAlone) {
  auto r = with_ratios({{0.5, 300.0}});
  off_policy_config cfg;
  EXPECT_FALSE(cfg.enabled());
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 0}}), cfg);
  expect_mask(out.loss_mask, {{1, 0}});
  EXPECT_FALSE(out.tis_ratio.defined());
  EXPECT_TRUE(out.metrics.empty());
}

TEST(AlgoOffPolicy, TokenTisCapsOnlyRatiosAboveTheCap) {
  auto r = with_ratios({{0.5, 1.5, 3.0}});
  off_policy_config cfg;
  cfg.tis_ratio_type = "token";
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 1, 1}}), cfg);
  expect_close(v(out.tis_ratio, 0, 0), 0.5); // no lower clip
  expect_close(v(out.tis_ratio, 0, 1), 1.5);
  expect_close(v(out.tis_ratio, 0, 2), 2.0); // cap 2 hit
  expect_close(out.metrics.at("tis_token_clip_high_ratio:mean"), 1.0 / 3.0);
  expect_mask(out.loss_mask, {{1, 1, 1}});
  cfg.token_tis_ratio_clip_high = 4.0; // not hit
  auto loose = compute_off_policy_correction(r.old, r.roll, t2({{1, 1, 1}}), cfg);
  expect_close(v(loose.tis_ratio, 0, 2), 3.0);
  EXPECT_EQ(loose.metrics.at("tis_token_clip_high_ratio:mean"), 0.0);
}

// Row 0: ρ = 2·2 (third token masked, ignored) = 4 < 5; row 1: 3·2·1 = 6 → capped at 5.
TEST(AlgoOffPolicy, SequenceTisMultipliesValidTokenRatiosAndCaps) {
  auto r = with_ratios({{2.0, 2.0, 7.0}, {3.0, 2.0, 1.0}});
  off_policy_config cfg;
  cfg.tis_ratio_type = "sequence";
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 1, 0}, {1, 1, 1}}), cfg);
  ASSERT_EQ(out.tis_ratio.sizes(), (std::vector<int64_t>{2, 1}));
  expect_close(v(out.tis_ratio, 0, 0), 4.0);
  expect_close(v(out.tis_ratio, 1, 0), 5.0);
  expect_close(out.metrics.at("tis_seq_clip_high_ratio:mean"), 0.5);
  cfg.sequence_tis_ratio_clip_high = 10.0;
  auto loose = compute_off_policy_correction(r.old, r.roll, t2({{1, 1, 0}, {1, 1, 1}}), cfg);
  expect_close(v(loose.tis_ratio, 1, 0), 6.0);
  EXPECT_EQ(loose.metrics.at("tis_seq_clip_high_ratio:mean"), 0.0);
}

// Geometric means: sqrt(1.005) ≈ 1.0025 (kept), sqrt(1.05) ≈ 1.0247 (> 1.01), 0.9 (< 0.99).
TEST(AlgoOffPolicy, GeometricSequenceMaskAcceptsAndRejects) {
  auto r = with_ratios({{1.005, 1.0}, {1.05, 1.0}, {0.9, 0.9}});
  off_policy_config cfg;
  cfg.sequence_mask_metric = "geometric";
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 1}, {1, 1}, {1, 1}}), cfg);
  expect_mask(out.loss_mask, {{1, 1}, {0, 0}, {0, 0}});
  expect_close(out.metrics.at("geo_sequence_mask_masked_ratio:mean"), 2.0 / 3.0);
  expect_close(out.metrics.at("geo_sequence_mask_over_high_ratio:mean"), 1.0 / 3.0);
  expect_close(out.metrics.at("geo_sequence_mask_under_low_ratio:mean"), 1.0 / 3.0);
  EXPECT_FALSE(out.tis_ratio.defined());
  cfg.geo_mask_high = 1.03;
  cfg.geo_mask_low = 0.8;
  auto wide = compute_off_policy_correction(r.old, r.roll, t2({{1, 1}, {1, 1}, {1, 1}}), cfg);
  expect_mask(wide.loss_mask, {{1, 1}, {1, 1}, {1, 1}});
  EXPECT_EQ(wide.metrics.at("geo_sequence_mask_masked_ratio:mean"), 0.0);
}

// Products: 1.8 (kept), 2.25 (> 2), 0.45 (< 0.5).
TEST(AlgoOffPolicy, ProductSequenceMaskAcceptsAndRejects) {
  auto r = with_ratios({{1.5, 1.2}, {1.5, 1.5}, {0.5, 0.9}});
  off_policy_config cfg;
  cfg.sequence_mask_metric = "product";
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 1}, {1, 1}, {1, 1}}), cfg);
  expect_mask(out.loss_mask, {{1, 1}, {0, 0}, {0, 0}});
  expect_close(out.metrics.at("product_sequence_mask_masked_ratio:mean"), 2.0 / 3.0);
  expect_close(out.metrics.at("product_sequence_mask_over_high_ratio:mean"), 1.0 / 3.0);
  expect_close(out.metrics.at("product_sequence_mask_under_low_ratio:mean"), 1.0 / 3.0);
}

// Row 0 has ρ = 200 > 100: whole row masked; row 1's tiny ρ sits on a masked position (ignored);
// row 2 has ρ = 1e-5 < 1e-4.
TEST(AlgoOffPolicy, OutlierTokenMasksItsWholeSequence) {
  auto r = with_ratios({{1.0, 200.0, 1.0}, {1.0, 1e-6, 1.0}, {1e-5, 1.0, 1.0}});
  auto mask = t2({{1, 1, 1}, {1, 0, 1}, {1, 1, 1}});
  off_policy_config cfg;
  cfg.outlier_token_is_threshold_low = 1e-4;
  cfg.outlier_token_is_threshold_high = 100.0;
  auto out = compute_off_policy_correction(r.old, r.roll, mask, cfg);
  expect_mask(out.loss_mask, {{0, 0, 0}, {1, 0, 1}, {0, 0, 0}});
  expect_close(out.metrics.at("outlier_seq_masked_ratio:mean"), 2.0 / 3.0);
  expect_close(out.metrics.at("outlier_seq_over_high_ratio:mean"), 1.0 / 3.0);
  expect_close(out.metrics.at("outlier_seq_under_low_ratio:mean"), 1.0 / 3.0);
  // Only the high threshold: row 2 stays.
  off_policy_config high_only;
  high_only.outlier_token_is_threshold_high = 100.0;
  auto h = compute_off_policy_correction(r.old, r.roll, mask, high_only);
  expect_mask(h.loss_mask, {{0, 0, 0}, {1, 0, 1}, {1, 1, 1}});
}

TEST(AlgoOffPolicy, TokenMaskDropsSingleTokensOutsideTheClosedInterval) {
  auto r = with_ratios({{0.4, 1.0, 2.5, 0.5, 2.0}});
  off_policy_config cfg;
  cfg.token_mask_is_threshold_low = 0.5;
  cfg.token_mask_is_threshold_high = 2.0;
  auto mask = t2({{1, 1, 1, 1, 1}});
  // 0.5 and 2.0 lie on the bounds (in fp32 exp(log 0.5) may round; use a hair of slack).
  cfg.token_mask_is_threshold_low = 0.5 - 1e-6;
  cfg.token_mask_is_threshold_high = 2.0 + 1e-6;
  auto out = compute_off_policy_correction(r.old, r.roll, mask, cfg);
  expect_mask(out.loss_mask, {{0, 1, 0, 1, 1}});
  expect_close(out.metrics.at("token_mask_ratio:mean"), 2.0 / 5.0);
  off_policy_config high_only;
  high_only.token_mask_is_threshold_high = 2.0 + 1e-6;
  auto h = compute_off_policy_correction(r.old, r.roll, mask, high_only);
  expect_mask(h.loss_mask, {{1, 1, 0, 1, 1}});
}

// Outlier masking happens first, so the TIS cap statistics only see the surviving row.
TEST(AlgoOffPolicy, TisIsComputedOnTheMaskAfterOutlierMasking) {
  auto r = with_ratios({{3.0, 200.0}, {1.0, 1.0}});
  off_policy_config cfg;
  cfg.outlier_token_is_threshold_high = 100.0;
  cfg.tis_ratio_type = "token";
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 1}, {1, 1}}), cfg);
  expect_mask(out.loss_mask, {{0, 0}, {1, 1}});
  // Token 3.0 would be capped, but its row is gone: 0 of 2 valid tokens.
  EXPECT_EQ(out.metrics.at("tis_token_clip_high_ratio:mean"), 0.0);
  // Without the outlier mask the same token counts: 2 of 4 (3 and 200 exceed 2).
  off_policy_config tis_only;
  tis_only.tis_ratio_type = "token";
  auto plain = compute_off_policy_correction(r.old, r.roll, t2({{1, 1}, {1, 1}}), tis_only);
  expect_close(plain.metrics.at("tis_token_clip_high_ratio:mean"), 0.5);
}

// ρ = 2, 10, 2: the token mask (≤ 5) drops the 10 first, so the sequence TIS sees 2·2 = 4 and
// the product mask (≤ 5) keeps the row; without the token mask the product would be 40.
TEST(AlgoOffPolicy, SequenceStatisticsSeeTheTokenMaskedTokensRemoved) {
  auto r = with_ratios({{2.0, 10.0, 2.0}});
  auto mask = t2({{1, 1, 1}});
  off_policy_config cfg;
  cfg.token_mask_is_threshold_high = 5.0;
  cfg.tis_ratio_type = "sequence";
  cfg.sequence_mask_metric = "product";
  cfg.product_mask_high = 5.0;
  auto out = compute_off_policy_correction(r.old, r.roll, mask, cfg);
  expect_mask(out.loss_mask, {{1, 0, 1}});
  expect_close(v(out.tis_ratio, 0, 0), 4.0);
  EXPECT_EQ(out.metrics.at("product_sequence_mask_masked_ratio:mean"), 0.0);
  off_policy_config no_token = cfg;
  no_token.token_mask_is_threshold_high.reset();
  auto rejected = compute_off_policy_correction(r.old, r.roll, mask, no_token);
  expect_mask(rejected.loss_mask, {{0, 0, 0}});
  expect_close(v(rejected.tis_ratio, 0, 0), 5.0); // 40 capped at 5
}

// ρ·m over all four entries = 2, 0.5, 1, 0: mean (of valid) 3.5/3, unbiased std of the four
// entries, max 2, min 0 (the masked entry counts as 0, as the reference reports it).
TEST(AlgoOffPolicy, ImportanceRatioStatistics) {
  auto r = with_ratios({{2.0, 0.5}, {1.0, 4.0}});
  off_policy_config cfg;
  cfg.tis_ratio_type = "token";
  auto out = compute_off_policy_correction(r.old, r.roll, t2({{1, 1}, {1, 0}}), cfg);
  const double xs[4] = {2.0, 0.5, 1.0, 0.0};
  double mean = 0;
  for (double x : xs)
    mean += x / 4;
  double ss = 0;
  for (double x : xs)
    ss += (x - mean) * (x - mean);
  expect_close(out.metrics.at("is_ratio_mean:mean"), 3.5 / 3.0);
  expect_close(out.metrics.at("is_ratio_std:mean"), std::sqrt(ss / 3.0));
  expect_close(out.metrics.at("is_ratio_max:max"), 2.0);
  EXPECT_EQ(out.metrics.at("is_ratio_min:min"), 0.0);
}

TEST(AlgoOffPolicy, ComputeLossZeroesRejectedSequencesAndReportsTheMask) {
  auto r = with_ratios({{1.0, 1.0}, {3.0, 1.0}});
  loss_inputs in;
  in.logprobs = r.old.clone().requires_grad_(true);
  in.old_logprobs = r.old;
  in.rollout_logprobs = r.roll;
  in.advantages = t2({{1, 2}, {3, 4}});
  loss_config cfg;
  cfg.options["sequence_mask_metric"] = "product";
  auto out = compute_loss("regular", in, cfg);
  // Row 1's product is 3 > 2: rejected. Row 0: -A per token.
  expect_close(out.loss.item<double>(), -3.0);
  EXPECT_EQ(v(out.elementwise, 1, 0), 0.0);
  expect_mask(out.loss_mask, {{1, 1}, {0, 0}});
  expect_close(out.metrics.at("product_sequence_mask_masked_ratio:mean"), 0.5);
  out.loss.backward();
  EXPECT_EQ(v(in.logprobs.grad(), 1, 0), 0.0);
  expect_close(v(in.logprobs.grad(), 0, 1), -2.0);
}

TEST(AlgoOffPolicy, ParsesEveryKeyAndRejectsBadValues) {
  loss_config c;
  c.options = {{"tis_ratio_type", "sequence"}, {"sequence_mask_metric", "geometric"}};
  c.values = {{"token_tis_ratio_clip_high", 3},
              {"sequence_tis_ratio_clip_high", 8},
              {"geo_mask_low", 0.9},
              {"geo_mask_high", 1.1},
              {"product_mask_low", 0.25},
              {"product_mask_high", 4},
              {"outlier_token_is_threshold_low", 1e-3},
              {"outlier_token_is_threshold_high", 50},
              {"token_mask_is_threshold_low", 0.2},
              {"token_mask_is_threshold_high", 5}};
  auto p = parse_off_policy_config(c, "test");
  EXPECT_EQ(p.tis_ratio_type, "sequence");
  EXPECT_EQ(p.sequence_mask_metric, "geometric");
  EXPECT_EQ(p.token_tis_ratio_clip_high, 3);
  EXPECT_EQ(p.sequence_tis_ratio_clip_high, 8);
  EXPECT_EQ(p.geo_mask_low, 0.9);
  EXPECT_EQ(p.geo_mask_high, 1.1);
  EXPECT_EQ(p.product_mask_low, 0.25);
  EXPECT_EQ(p.product_mask_high, 4);
  EXPECT_EQ(*p.outlier_token_is_threshold_low, 1e-3);
  EXPECT_EQ(*p.outlier_token_is_threshold_high, 50);
  EXPECT_EQ(*p.token_mask_is_threshold_low, 0.2);
  EXPECT_EQ(*p.token_mask_is_threshold_high, 5);
  EXPECT_TRUE(p.enabled());
  EXPECT_EQ(off_policy_value_keys().size(), c.values.size());
  EXPECT_EQ(off_policy_option_keys().size(), c.options.size());

  auto bad = [](loss_config cfg, std::vector<std::string> frags) {
    expect_error([&] { parse_off_policy_config(cfg, "test"); }, frags);
  };
  loss_config t;
  t.options["tis_ratio_type"] = "tokens";
  bad(t, {"tis_ratio_type", "'tokens'", "none, token, sequence"});
  loss_config s;
  s.options["sequence_mask_metric"] = "arithmetic";
  bad(s, {"sequence_mask_metric", "arithmetic", "geometric"});
  bad(loss_config{{{"token_tis_ratio_clip_high", -1.0}}, {}}, {"token_tis_ratio_clip_high", "-1"});
  bad(loss_config{{{"sequence_tis_ratio_clip_high", 0.0}}, {}}, {"sequence_tis_ratio_clip_high"});
  bad(loss_config{{{"geo_mask_low", nan_v}}, {}}, {"geo_mask_low", "nan"});
  bad(loss_config{{{"geo_mask_high", 0.5}}, {}}, {"geo_mask_low", "geo_mask_high"});
  bad(loss_config{{{"product_mask_low", 3.0}}, {}}, {"product_mask_low", "product_mask_high"});
  bad(
      loss_config{
          {{"outlier_token_is_threshold_low", 10.0}, {"outlier_token_is_threshold_high", 5.0}}, {}},
      {"outlier_token_is_threshold_low", "outlier_token_is_threshold_high"});
  bad(loss_config{{{"token_mask_is_threshold_high", -2.0}}, {}},
      {"token_mask_is_threshold_high", "-2"});
  // Through a loss: the message names the loss too.
  loss_inputs in;
  in.logprobs = t2({{-1.0}});
  in.old_logprobs = t2({{-1.0}});
  in.advantages = t2({{1.0}});
  expect_error(
      [&] {
        compute_loss("gspo", in, loss_config{{{"geo_mask_low", -0.5}}, {}});
      },
      {"gspo", "geo_mask_low", "-0.5"});
}

TEST(AlgoOffPolicy, BadTensorsAreRejected) {
  off_policy_config cfg;
  cfg.tis_ratio_type = "token";
  auto ok = t2({{0.0, 0.0}});
  expect_error(
      [&] {
        compute_off_policy_correction(ok, t2({{0.0, 0.0, 0.0}}), ok, cfg);
      },
      {"'rollout_logprobs'", "[1, 3]", "[1, 2]"});
  expect_error([&] { compute_off_policy_correction(ok, ok, t2({{1.0}}), cfg); },
               {"'loss_mask'", "[1, 1]"});
  expect_error(
      [&] {
        compute_off_policy_correction(ok, t2({{0.0, nan_v}}), ok, cfg);
      },
      {"'rollout_logprobs'", "NaN"});
  expect_error([&] { compute_off_policy_correction(at::Tensor(), ok, ok, cfg); },
               {"'old_logprobs'"});
  // A loss that needs no old log-probs still needs them once the correction is active.
  loss_inputs in;
  in.logprobs = ok;
  in.rollout_logprobs = ok;
  in.advantages = t2({{1.0, 1.0}});
  loss_config c;
  c.options["tis_ratio_type"] = "token";
  expect_error([&] { compute_loss("rollout_is", in, c); }, {"rollout_is", "'old_logprobs'"});
  EXPECT_NO_THROW(compute_loss("rollout_is", in));
}

TEST(AlgoOffPolicy, ReportsEveryMetricNameOfTheEnabledMechanisms) {
  auto r = with_ratios({{1.0, 1.2}, {0.9, 1.0}});
  auto mask = t2({{1, 1}, {1, 1}});
  for (const std::string metric : {"geometric", "product"}) {
    for (const std::string tis : {"token", "sequence"}) {
      off_policy_config cfg;
      cfg.tis_ratio_type = tis;
      cfg.sequence_mask_metric = metric;
      cfg.outlier_token_is_threshold_low = 1e-4;
      cfg.outlier_token_is_threshold_high = 100.0;
      cfg.token_mask_is_threshold_low = 0.1;
      cfg.token_mask_is_threshold_high = 10.0;
      auto out = compute_off_policy_correction(r.old, r.roll, mask, cfg);
      const std::string prefix = metric == "geometric" ? "geo" : "product";
      std::vector<std::string> want = {"is_ratio_mean:mean",
                                       "is_ratio_std:mean",
                                       "is_ratio_max:max",
                                       "is_ratio_min:min",
                                       "outlier_seq_masked_ratio:mean",
                                       "outlier_seq_over_high_ratio:mean",
                                       "outlier_seq_under_low_ratio:mean",
                                       "token_mask_ratio:mean",
                                       prefix + "_sequence_mask_masked_ratio:mean",
                                       prefix + "_sequence_mask_over_high_ratio:mean",
                                       prefix + "_sequence_mask_under_low_ratio:mean",
                                       tis == "token" ? "tis_token_clip_high_ratio:mean"
                                                      : "tis_seq_clip_high_ratio:mean"};
      EXPECT_EQ(out.metrics.size(), want.size()) << metric << " " << tis;
      for (const auto& name : want)
        EXPECT_TRUE(out.metrics.count(name)) << name;
    }
  }
}

// Row 1's product ratio 3 exceeds 2: every loss with the block zeroes that row; the losses
// without it do not accept the keys at all.
TEST(AlgoOffPolicy, EveryListedLossAppliesTheBlockAndTheOthersRefuseIt) {
  auto r = with_ratios({{1.0, 1.0}, {3.0, 1.0}});
  loss_inputs in;
  in.logprobs = t2({{-0.1, 0.05}, {-0.2, -0.9}});
  in.old_logprobs = r.old;
  in.rollout_logprobs = r.roll;
  in.advantages = t2({{1, -1}, {2, 1}});
  loss_config cfg;
  cfg.options["sequence_mask_metric"] = "product";
  for (const std::string name :
       {"regular", "dual_clip", "gspo", "sapo", "cispo", "rollout_is", "dppo"}) {
    auto out = compute_loss(name, in, cfg);
    EXPECT_EQ(v(out.elementwise, 1, 0), 0.0) << name;
    EXPECT_EQ(v(out.elementwise, 1, 1), 0.0) << name;
    EXPECT_NE(v(out.elementwise, 0, 0), 0.0) << name;
    expect_close(out.metrics.at("product_sequence_mask_masked_ratio:mean"), 0.5);
  }
  for (const std::string name : {"clip_cov", "kl_cov", "cross_entropy", "importance_sampling"})
    expect_error([&] { compute_loss(name, in, cfg); }, {name, "sequence_mask_metric"});
}
