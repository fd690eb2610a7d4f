// The losses' registry and contracts (backends/algo/losses.hpp): names, kinds and metric names,
// which losses take the off-policy correction, masked tokens, refused configs and inputs, one
// check per request, and double inputs computed in float32.
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

TEST(AlgoLossChecks, EveryLossReportsItsMetricNames) {
  auto old = t2({{-1.0, -1.2}});
  loss_inputs in;
  in.logprobs = t2({{-0.9, -1.3}});
  in.old_logprobs = old;
  in.rollout_logprobs = t2({{-1.05, -1.2}});
  in.advantages = t2({{1, -1}});
  in.entropy = t2({{0.5, 1.5}});
  for (const auto& name : policy_loss_names()) {
    loss_config c;
    if (name == "dro")
      c.values["beta"] = 0.1;
    auto out = compute_loss(name, in, c);
    EXPECT_TRUE(out.metrics.count("loss:sum")) << name;
    expect_close(out.metrics.at("entropy:mean"), 1.0);
    const bool clip = name != "cross_entropy" && name != "importance_sampling" && name != "dro";
    EXPECT_EQ(out.metrics.count("clip_ratio:mean"), clip ? 1u : 0u) << name;
    if (name == "importance_sampling") {
      EXPECT_TRUE(out.metrics.count("importance_ratio:mean"));
    }
    for (const auto& [k, x] : out.metrics)
      EXPECT_NE(k.find(':'), std::string::npos) << name << " " << k;
  }
  in.values = t2({{1, 2}});
  in.old_values = t2({{1, 2}});
  in.returns = t2({{1, 2}});
  auto critic = compute_loss("ppo_critic", in);
  EXPECT_TRUE(critic.metrics.count("loss:sum"));
  EXPECT_TRUE(critic.metrics.count("clipfrac:mean"));
}

TEST(AlgoLossChecks, OffPolicyCorrectionAppliesOnlyToTheListedLosses) {
  const std::set<std::string> with = {"regular", "dual_clip",  "gspo", "sapo",
                                      "cispo",   "rollout_is", "dppo"};
  for (const auto& name : policy_loss_names()) {
    auto keys = loss_value_keys(name);
    const bool has = std::find(keys.begin(), keys.end(), "token_tis_ratio_clip_high") != keys.end();
    EXPECT_EQ(has, with.count(name) > 0) << name;
    auto opts = loss_option_keys(name);
    EXPECT_EQ(std::find(opts.begin(), opts.end(), "tis_ratio_type") != opts.end(),
              with.count(name) > 0)
        << name;
  }
  // regular with token TIS: ρ = exp(old - roll) = 3 capped at 2 multiplies the token loss.
  auto old = t2({{0.0, 0.0}});
  loss_inputs in;
  in.logprobs = t2({{0.0, 0.0}});
  in.old_logprobs = old;
  in.rollout_logprobs = t2({{-std::log(3.0), 0.0}});
  in.advantages = t2({{1, 1}});
  loss_config c;
  c.options["tis_ratio_type"] = "token";
  auto out = compute_loss("regular", in, c);
  expect_close(v(out.elementwise, 0, 0), -2.0);
  expect_close(v(out.elementwise, 0, 1), -1.0);
  expect_close(out.metrics.at("tis_token_clip_high_ratio:mean"), 0.5);
  expect_close(out.metrics.at("is_ratio_max:max"), 3.0);
  // Without rollout log-probs the block is skipped.
  in.rollout_logprobs = at::Tensor();
  auto plain = compute_loss("regular", in, c);
  expect_close(plain.loss.item<double>(), -2.0);
  EXPECT_EQ(plain.metrics.count("is_ratio_mean:mean"), 0u);
  // clip_cov refuses the keys.
  expect_error([&] { compute_loss("clip_cov", in, c); }, {"tis_ratio_type", "clip_cov"});
}

TEST(AlgoLossChecks, MaskedTokensContributeNothingToLossOrGradient) {
  auto old = t2({{-1.0, -1.0}});
  auto logp = logp_for(old, {{1.0, 1.0}});
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{1, 100}});
  in.loss_mask = t2({{1, 0}});
  for (const auto& name : {"regular", "dual_clip", "gspo", "sapo", "cispo", "importance_sampling",
                           "kl_cov", "clip_cov"}) {
    logp.mutable_grad() = at::Tensor();
    auto out = compute_loss(name, in);
    EXPECT_EQ(v(out.elementwise, 0, 1), 0.0) << name;
    auto g = grad_of(out, logp);
    EXPECT_EQ(v(g, 0, 1), 0.0) << name;
  }
}

TEST(AlgoLossChecks, RegistryNamesAndKinds) {
  const std::vector<std::string> want = {
      "cross_entropy", "importance_sampling", "regular", "dual_clip", "gspo",   "sapo",
      "cispo",         "rollout_is",          "dppo",    "clip_cov",  "kl_cov", "dro"};
  EXPECT_EQ(policy_loss_names(), want);
  EXPECT_EQ(value_loss_names(), std::vector<std::string>{"ppo_critic"});
  EXPECT_TRUE(is_value_loss("ppo_critic"));
  EXPECT_FALSE(is_value_loss("regular"));
  EXPECT_FALSE(is_value_loss("nope"));
  EXPECT_TRUE(is_loss_name("kl_cov"));
  EXPECT_FALSE(is_loss_name("ppo")); // the Tinker name is mapped by tinker/loss_catalog.hpp
}

TEST(AlgoLossChecks, BadConfigsAreRejectedNamingKeyAndValue) {
  loss_inputs in;
  in.logprobs = t2({{-1.0}});
  in.old_logprobs = t2({{-1.0}});
  in.advantages = t2({{1.0}});
  expect_error([&] { compute_loss("ppo", in); }, {"'ppo'", "regular", "ppo_critic"});
  expect_error(
      [&] {
        compute_loss("regular", in, values({{"eps_low", 0.2}}));
      },
      {"'eps_low'", "eps_clip_low", "eps_clip_high", "tis_ratio_type"});
  expect_error(
      [&] {
        compute_loss("regular", in, values({{"eps_clip_low", -0.1}}));
      },
      {"eps_clip_low", "-0.1"});
  expect_error(
      [&] {
        compute_loss("regular", in, values({{"eps_clip_high", nan_v}}));
      },
      {"eps_clip_high", "nan"});
  expect_error(
      [&] {
        compute_loss("dual_clip", in, values({{"clip_ratio_c", 1.0}}));
      },
      {"clip_ratio_c", "1"});
  expect_error([&] { compute_loss("sapo", in, values({{"tau_neg", 0.0}})); }, {"tau_neg", "0"});
  expect_error(
      [&] {
        compute_loss("clip_cov", in, values({{"clip_ratio", 1.5}}));
      },
      {"clip_ratio", "1.5"});
  expect_error(
      [&] {
        compute_loss("clip_cov", in, values({{"clip_cov_lb", 3}, {"clip_cov_ub", 2}}));
      },
      {"clip_cov_lb", "clip_cov_ub"});
  expect_error([&] { compute_loss("clip_cov", in, values({{"seed", 1.5}})); }, {"seed", "1.5"});
  expect_error(
      [&] {
        compute_loss("kl_cov", in, values({{"kl_cov_frac", -1}}));
      },
      {"kl_cov_frac", "-1"});
  expect_error([&] { compute_loss("dro", in); }, {"missing required config key 'beta'"});
  expect_error([&] { compute_loss("dro", in, values({{"beta", -1}})); }, {"beta", "-1"});
  expect_error(
      [&] {
        compute_loss("ppo_critic", in, values({{"value_clip", -0.2}}));
      },
      {"value_clip", "-0.2"});
  expect_error(
      [&] {
        compute_loss("cross_entropy", in, values({{"eps_clip_low", 0.2}}));
      },
      {"'eps_clip_low'", "cross_entropy"});
  loss_config bad_opt;
  bad_opt.options["dppo_type"] = "topk";
  expect_error([&] { compute_loss("dppo", in, bad_opt); }, {"dppo_type", "topk", "binary_tv"});
  loss_config unknown_opt;
  unknown_opt.options["flavour"] = "x";
  expect_error([&] { compute_loss("regular", in, unknown_opt); }, {"'flavour'"});
  loss_config twice;
  twice.options["cispo_anchor"] = "rollout";
  twice.options["tis_ratio_type"] = "token";
  expect_error([&] { compute_loss("cispo", in, twice); }, {"cispo_anchor", "tis_ratio_type"});
  expect_error([&] { validate_loss_config("regular", values({{"x", 1}})); }, {"'x'"});
  EXPECT_NO_THROW(validate_loss_config("regular", values({{"eps_clip_low", 0.1}})));
  expect_error([] { loss_value_keys("nope"); }, {"'nope'"});
  expect_error([] { loss_option_keys("nope"); }, {"'nope'"});
  expect_error([] { validate_loss_config("nope", {}); }, {"'nope'", "dro"});
}

// compute_loss and check_loss_inputs (its checks without computing, what the worker runs on a
// whole batch first) refuse the same inputs with the same message.
void expect_refused_by_both(const std::string& loss, const loss_inputs& in,
                            const std::vector<std::string>& parts) {
  expect_error([&] { compute_loss(loss, in); }, parts);
  expect_error([&] { check_loss_inputs(loss, in); }, parts);
}

TEST(AlgoLossChecks, BadInputsAreRejectedNamingTheInput) {
  loss_inputs in;
  in.logprobs = t2({{-1.0, -1.0}});
  in.old_logprobs = t2({{-1.0, -1.0}});
  in.advantages = t2({{1.0, 1.0}});
  check_loss_inputs("regular", in); // accepted, as compute_loss accepts it

  auto no_old = in;
  no_old.old_logprobs = at::Tensor();
  expect_refused_by_both("regular", no_old, {"regular", "'old_logprobs'"});
  auto no_adv = in;
  no_adv.advantages = at::Tensor();
  expect_refused_by_both("cispo", no_adv, {"cispo", "'advantages'"});
  auto no_logp = in;
  no_logp.logprobs = at::Tensor();
  expect_refused_by_both("cross_entropy", no_logp, {"'logprobs'"});
  expect_refused_by_both("rollout_is", in, {"rollout_is", "'rollout_logprobs'"});
  auto dppo_in = no_old;
  expect_refused_by_both("dppo", dppo_in, {"dppo", "rollout_logprobs"});

  loss_inputs critic;
  critic.values = t2({{1.0}});
  critic.old_values = t2({{1.0}});
  expect_refused_by_both("ppo_critic", critic, {"ppo_critic", "'returns'"});
  critic.returns = t2({{1.0}});
  critic.values = at::Tensor();
  expect_refused_by_both("ppo_critic", critic, {"ppo_critic", "'values'"});
  critic.values = t2({{1.0}});
  critic.old_values = at::Tensor();
  expect_refused_by_both("ppo_critic", critic, {"'old_values'"});

  auto shape = in;
  shape.advantages = t2({{1.0, 1.0, 1.0}});
  expect_refused_by_both("regular", shape, {"'advantages'", "[1, 3]", "[1, 2]"});
  auto mask_shape = in;
  mask_shape.loss_mask = t2({{1.0}, {1.0}});
  expect_refused_by_both("regular", mask_shape, {"'loss_mask'", "[2, 1]", "[1, 2]"});
  auto flat = in;
  flat.logprobs = at::zeros({2});
  expect_refused_by_both("regular", flat, {"'logprobs'", "2-D"});

  auto nan_in = in;
  nan_in.logprobs = t2({{-1.0, nan_v}});
  expect_refused_by_both("regular", nan_in, {"'logprobs'", "NaN"});
  auto inf_in = in;
  inf_in.advantages = t2({{1.0, inf}});
  expect_refused_by_both("regular", inf_in, {"'advantages'", "NaN or infinite"});
  auto bad_roll = in;
  bad_roll.rollout_logprobs = t2({{-inf, 0}});
  expect_refused_by_both("regular", bad_roll, {"'rollout_logprobs'"});
  auto bad_metric_mask = in;
  bad_metric_mask.metric_mask = t2({{1.0}});
  expect_refused_by_both("regular", bad_metric_mask, {"'metric_mask'", "[1, 1]"});
  auto int_adv = in;
  int_adv.advantages = at::ones({1, 2}, at::kLong);
  expect_refused_by_both("regular", int_adv, {"'advantages'", "floating-point"});
}

// A request is checked once: its loss and config (check_loss), its inputs before the model's
// outputs exist (check_request_inputs); then each micro-batch is computed without checks, and
// gives exactly what the checked call gives.
TEST(AlgoLossChecks, ACheckedLossComputesExactlyWhatTheCheckingCallComputes) {
  auto old = t2({{-1.0, -0.7, -1.2}, {-0.5, -0.9, -0.3}});
  auto ratios = std::vector<std::vector<double>>{{0.5, 1.0, 1.5}, {0.8, 1.3, 0.6}};
  loss_inputs in;
  in.old_logprobs = old;
  in.rollout_logprobs = old + 0.05;
  in.advantages = t2({{2, 2, 2}, {-1, -1, -1}});
  in.loss_mask = t2({{1, 1, 0}, {1, 0.5, 1}});
  auto corrected = values({{"eps_clip_low", 0.3}, {"token_tis_ratio_clip_high", 1.2}});
  corrected.options["tis_ratio_type"] = "token";
  const std::vector<std::pair<std::string, loss_config>> cases = {
      {"regular", corrected},      {"cispo", {}},         {"rollout_is", {}},
      {"importance_sampling", {}}, {"cross_entropy", {}},
  };
  for (const auto& [name, cfg] : cases) {
    SCOPED_TRACE(name);
    auto checked = check_loss(name, cfg);
    EXPECT_EQ(checked.name(), name);
    auto request = in;
    if (name == "cross_entropy")
      request.old_logprobs = request.rollout_logprobs = request.advantages = at::Tensor();
    check_request_inputs(checked, request); // no log-probs yet: the model has not run
    auto a_in = request, b_in = request;
    a_in.logprobs = logp_for(old, ratios);
    b_in.logprobs = logp_for(old, ratios);
    auto a = compute_loss(name, a_in, cfg);
    auto b = compute_loss(checked, b_in);
    EXPECT_TRUE(at::equal(a.elementwise, b.elementwise));
    EXPECT_EQ(a.metrics, b.metrics);
    EXPECT_TRUE(at::equal(grad_of(a, a_in.logprobs), grad_of(b, b_in.logprobs)));
  }
  loss_inputs critic;
  critic.returns = t2({{1.0, 2.0}});
  critic.old_values = t2({{0.5, 1.5}});
  critic.loss_mask = t2({{1.0, 1.0}});
  auto checked = check_loss("ppo_critic", values({{"value_clip", 0.2}}));
  check_request_inputs(checked, critic);
  critic.values = t2({{0.9, 1.1}}).requires_grad_(true);
  auto a = compute_loss("ppo_critic", critic, values({{"value_clip", 0.2}}));
  auto b = compute_loss(checked, critic);
  EXPECT_TRUE(at::equal(a.elementwise, b.elementwise));
  EXPECT_EQ(a.metrics, b.metrics);
}

TEST(AlgoLossChecks, ARequestIsRefusedBeforeTheModelRunsAsComputeLossWouldRefuseIt) {
  // The config, as validate_loss_config refuses it.
  expect_error([] { (void)check_loss("ppo_typo"); }, {"ppo_typo"});
  expect_error(
      [] {
        (void)check_loss("regular", values({{"eps_clip_low", -1.0}}));
      },
      {"eps_clip_low"});
  loss_inputs in;
  in.old_logprobs = t2({{-1.0, -1.0}});
  in.advantages = t2({{1.0, 1.0}});
  in.loss_mask = t2({{1.0, 1.0}});
  const auto regular = check_loss("regular");
  check_request_inputs(regular, in);
  // Model outputs given with the request are not the request's: they are not looked at.
  auto with_outputs = in;
  with_outputs.logprobs = t2({{nan_v, 0.0}});
  check_request_inputs(regular, with_outputs);

  auto no_adv = in;
  no_adv.advantages = at::Tensor();
  expect_error([&] { check_request_inputs(regular, no_adv); }, {"regular", "'advantages'"});
  auto no_old = in;
  no_old.old_logprobs = at::Tensor();
  expect_error([&] { check_request_inputs(regular, no_old); }, {"'old_logprobs'"});
  expect_error([&] { check_request_inputs(check_loss("rollout_is"), in); },
               {"rollout_is", "'rollout_logprobs'"});
  auto shape = in;
  shape.advantages = t2({{1.0, 1.0, 1.0}});
  expect_error([&] { check_request_inputs(regular, shape); },
               {"'advantages'", "[1, 3]", "'loss_mask'", "[1, 2]"});
  auto inf_in = in;
  inf_in.advantages = t2({{1.0, inf}});
  expect_error([&] { check_request_inputs(regular, inf_in); }, {"'advantages'", "NaN or infinite"});
  auto int_adv = in;
  int_adv.advantages = at::ones({1, 2}, at::kLong);
  expect_error([&] { check_request_inputs(regular, int_adv); }, {"floating-point"});
  loss_inputs critic;
  critic.loss_mask = t2({{1.0}});
  expect_error([&] { check_request_inputs(check_loss("ppo_critic"), critic); },
               {"ppo_critic", "'returns'"});
  // Without a loss mask there is nothing to check the shapes against: only our own code can
  // send such a request (the worker always builds one).
  auto no_mask = in;
  no_mask.loss_mask = at::Tensor();
  expect_error([&] { check_request_inputs(regular, no_mask); }, error_code::internal,
               {"loss mask"});
}

TEST(AlgoLossChecks, DoubleInputsAreComputedInFloat32WithGradients) {
  auto old = t2({{-1.0, -1.0}}).to(at::kDouble);
  auto logp = (old + t2({{0.1, -0.1}}).to(at::kDouble)).detach().requires_grad_(true);
  loss_inputs in;
  in.logprobs = logp;
  in.old_logprobs = old;
  in.advantages = t2({{1.0, 1.0}}).to(at::kDouble);
  auto out = compute_loss("regular", in);
  EXPECT_EQ(out.loss.scalar_type(), at::kFloat);
  out.loss.backward();
  ASSERT_TRUE(logp.grad().defined());
  expect_close(v(logp.grad(), 0, 0), -std::exp(0.1));
  expect_close(v(logp.grad(), 0, 1), -std::exp(-0.1));
}
