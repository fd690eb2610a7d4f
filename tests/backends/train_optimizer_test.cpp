#include "backends/train/lr_schedule.hpp"
#include "backends/train/optimizer.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

named_parameters make_params(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {{"a.weight", leaf(at::empty({4, 3}).normal_(0, 1, gen))},
          {"a.bias", leaf(at::empty({4}).normal_(0, 1, gen))},
          {"b.weight", leaf(at::empty({2, 2, 2}).normal_(0, 1, gen))}};
}

named_parameters clone_params(const named_parameters& params) {
  named_parameters out;
  for (const auto& [name, p] : params)
    out.emplace_back(name, leaf(p.detach().clone()));
  return out;
}

void set_grads(const named_parameters& params, uint64_t seed, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, p] : params)
    at::Tensor(p).mutable_grad() = at::empty_like(p).normal_(0, scale, gen);
}

double max_abs_diff(const named_parameters& a, const named_parameters& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>());
  return worst;
}

// One AdamW update of a scalar in double, straight from the paper's algorithm.
struct scalar_adamw {
  double p, m = 0, v = 0;
  int t = 0;
  void step(double g, const adam_params& hp) {
    ++t;
    p *= 1 - hp.learning_rate * hp.weight_decay;
    m = hp.beta1 * m + (1 - hp.beta1) * g;
    v = hp.beta2 * v + (1 - hp.beta2) * g * g;
    double m_hat = m / (1 - std::pow(hp.beta1, t));
    double v_hat_root = std::sqrt(v) / std::sqrt(1 - std::pow(hp.beta2, t));
    p -= hp.learning_rate * m_hat / (v_hat_root + hp.eps);
  }
};

} // namespace

TEST(AdamW, MatchesTorchAdamWForFixedHyperParameters) {
  adam_params hp;
  hp.learning_rate = 1e-2;
  hp.beta1 = 0.8;
  hp.beta2 = 0.95;
  hp.eps = 1e-8;
  hp.weight_decay = 0.1;
  auto ours = make_params(1);
  auto theirs = clone_params(ours);
  std::vector<at::Tensor> theirs_list;
  for (const auto& [name, p] : theirs)
    theirs_list.push_back(p);
  torch::optim::AdamW reference(theirs_list, torch::optim::AdamWOptions(hp.learning_rate)
                                                 .betas({hp.beta1, hp.beta2})
                                                 .eps(hp.eps)
                                                 .weight_decay(hp.weight_decay));
  adamw opt;
  for (uint64_t step = 0; step < 5; ++step) {
    set_grads(ours, 100 + step);
    set_grads(theirs, 100 + step);
    auto r = opt.step(ours, hp);
    reference.step();
    EXPECT_FALSE(r.skipped);
    EXPECT_FALSE(r.clipped);
    EXPECT_LT(max_abs_diff(ours, theirs), 1e-6) << "step " << step;
  }
  EXPECT_EQ(opt.state_of("a.bias")->step, 5);
  EXPECT_GT(max_abs_diff(ours, make_params(1)), 1e-3); // the parameters did move
}

TEST(AdamW, HonoursEveryHyperParameterPerCall) {
  auto w = leaf(at::full({1}, 0.75f));
  named_parameters params{{"w", w}};
  std::vector<adam_params> schedule(3);
  schedule[0].learning_rate = 0.1;
  schedule[0].weight_decay = 0.5;
  schedule[1].learning_rate = 0.02;
  schedule[1].beta1 = 0.5;
  schedule[1].beta2 = 0.7;
  schedule[1].eps = 1e-3;
  schedule[2].learning_rate = 0.3;
  schedule[2].beta1 = 0.0;
  schedule[2].beta2 = 0.999;
  schedule[2].weight_decay = 0.01;
  const double grads[] = {0.5, -2.0, 0.25};
  scalar_adamw expected{0.75};
  adamw opt;
  for (int i = 0; i < 3; ++i) {
    w.mutable_grad() = at::full({1}, grads[i]);
    opt.step(params, schedule[i]);
    expected.step(grads[i], schedule[i]);
    EXPECT_NEAR(w.item<double>(), expected.p, 1e-6) << "step " << i;
    EXPECT_EQ(opt.last_params(), schedule[i]);
  }
  EXPECT_NEAR(opt.state_of("w")->exp_avg.item<double>(), expected.m, 1e-7);
  EXPECT_NEAR(opt.state_of("w")->exp_avg_sq.item<double>(), expected.v, 1e-7);
}

TEST(AdamW, LearningRateChangesOnlyTheStepItIsGivenTo) {
  auto a = make_params(2);
  auto b = clone_params(a);
  adamw opt_a, opt_b;
  adam_params hp;
  hp.learning_rate = 1e-2;
  set_grads(a, 7);
  set_grads(b, 7);
  opt_a.step(a, hp);
  opt_b.step(b, hp);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  auto before = clone_params(b);
  set_grads(a, 8);
  set_grads(b, 8);
  opt_a.step(a, hp);
  adam_params zero = hp;
  zero.learning_rate = 0.0;
  opt_b.step(b, zero);
  EXPECT_EQ(max_abs_diff(b, before), 0.0); // lr 0: no movement, yet the moments advanced
  EXPECT_GT(max_abs_diff(a, b), 1e-4);
  EXPECT_EQ(opt_b.state_of("a.weight")->step, 2);
}

TEST(AdamW, ClipsByTheGlobalNormAndReportsThePreClipNorm) {
  auto x = leaf(at::zeros({2}));
  auto y = leaf(at::zeros({1}));
  named_parameters params{{"x", x}, {"y", y}};
  x.mutable_grad() = at::tensor({3.0f, 0.0f});
  y.mutable_grad() = at::tensor({4.0f});
  EXPECT_DOUBLE_EQ(global_grad_norm(params), 5.0);
  adam_params hp;
  hp.grad_clip_norm = 1.0;
  adamw opt;
  auto r = opt.step(params, hp);
  EXPECT_NEAR(r.grad_norm, 5.0, 1e-12);
  EXPECT_TRUE(r.clipped);
  EXPECT_FALSE(r.skipped);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(x.grad()[0].item<double>(), 3.0 * coef, 1e-7);
  EXPECT_NEAR(y.grad()[0].item<double>(), 4.0 * coef, 1e-7);
  EXPECT_NEAR(global_grad_norm(params), 1.0, 1e-6);
  // The moments saw the clipped gradient.
  EXPECT_NEAR(opt.state_of("y")->exp_avg.item<double>(), (1 - hp.beta1) * 4.0 * coef, 1e-7);

  // A norm under the limit leaves gradients as they are.
  x.mutable_grad() = at::tensor({0.3f, 0.0f});
  y.mutable_grad() = at::tensor({0.4f});
  hp.grad_clip_norm = 1.0;
  r = opt.step(params, hp);
  EXPECT_NEAR(r.grad_norm, 0.5, 1e-7);
  EXPECT_FALSE(r.clipped);
  EXPECT_FLOAT_EQ(y.grad()[0].item<float>(), 0.4f);
}

TEST(AdamW, NonFiniteGradientNormSkipsTheStepAndChangesNothing) {
  auto params = make_params(3);
  adamw opt;
  adam_params hp;
  hp.learning_rate = 0.05;
  hp.weight_decay = 0.1;
  set_grads(params, 11);
  opt.step(params, hp);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto before = clone_params(params);
    auto state_before = opt.state();
    set_grads(params, 12);
    params[1].second.mutable_grad()[2] = bad;
    auto r = opt.step(params, hp);
    EXPECT_TRUE(r.skipped);
    EXPECT_FALSE(r.clipped);
    EXPECT_FALSE(std::isfinite(r.grad_norm));
    EXPECT_EQ(max_abs_diff(params, before), 0.0);
    auto state_after = opt.state();
    for (const auto& [name, s] : state_before.params) {
      EXPECT_EQ(state_after.params.at(name).step, s.step) << name;
      EXPECT_TRUE(at::equal(state_after.params.at(name).exp_avg, s.exp_avg)) << name;
      EXPECT_TRUE(at::equal(state_after.params.at(name).exp_avg_sq, s.exp_avg_sq)) << name;
    }
  }
}

TEST(AdamW, WeightDecayIsDecoupledFromTheGradient) {
  // Zero gradient: only the decay acts, p ← p·(1 − lr·wd) exactly.
  auto w = leaf(at::tensor({2.0f, -4.0f}));
  named_parameters params{{"w", w}};
  w.mutable_grad() = at::zeros({2});
  adam_params hp;
  hp.learning_rate = 0.1;
  hp.weight_decay = 0.5;
  adamw opt;
  opt.step(params, hp);
  EXPECT_FLOAT_EQ(w[0].item<float>(), 2.0f * 0.95f);
  EXPECT_FLOAT_EQ(w[1].item<float>(), -4.0f * 0.95f);

  // First step with gradient g: p(1 − lr·wd) − lr·g/(|g| + eps). Coupled (L2) decay would put
  // wd·p into g and give p − lr·sign(g + wd·p) instead.
  auto v = leaf(at::tensor({2.0f}));
  named_parameters one{{"v", v}};
  v.mutable_grad() = at::tensor({-0.5f});
  adamw fresh;
  fresh.step(one, hp);
  double expected = 2.0 * (1 - 0.1 * 0.5) - 0.1 * (-0.5) / (0.5 + hp.eps);
  EXPECT_NEAR(v.item<double>(), expected, 1e-6);
  EXPECT_GT(std::fabs(v.item<double>() - (2.0 - 0.1)), 0.1);
}

TEST(AdamW, ParametersWithoutGradientAreLeftAlone) {
  auto params = make_params(4);
  set_grads(params, 5);
  at::Tensor(params[2].second).mutable_grad() = at::Tensor();
  auto before = params[2].second.detach().clone();
  adamw opt;
  opt.step(params, adam_params{});
  EXPECT_TRUE(at::equal(params[2].second, before));
  EXPECT_EQ(opt.state_of("b.weight"), nullptr);
  ASSERT_NE(opt.state_of("a.weight"), nullptr);
  EXPECT_EQ(opt.state_of("a.weight")->step, 1);
}

TEST(AdamW, AdamParamsValidationNamesTheField) {
  auto bad = [](auto mutate, std::vector<std::string> fragments) {
    adam_params hp;
    mutate(hp);
    expect_error([&] { validate(hp); }, error_code::invalid_argument, fragments);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  bad([](adam_params& h) { h.learning_rate = -1e-3; }, {"learning_rate", "-0.001"});
  bad([&](adam_params& h) { h.learning_rate = nan; }, {"learning_rate", "nan"});
  bad([](adam_params& h) { h.beta1 = 1.0; }, {"beta1", "[0, 1)"});
  bad([](adam_params& h) { h.beta1 = -0.1; }, {"beta1", "-0.1"});
  bad([](adam_params& h) { h.beta2 = 1.5; }, {"beta2", "1.5"});
  bad([&](adam_params& h) { h.beta2 = nan; }, {"beta2", "nan"});
  bad([](adam_params& h) { h.eps = 0.0; }, {"eps", "> 0"});
  bad([&](adam_params& h) { h.eps = inf; }, {"eps", "inf"});
  bad([](adam_params& h) { h.weight_decay = -0.5; }, {"weight_decay", "-0.5"});
  bad([](adam_params& h) { h.grad_clip_norm = -1.0; }, {"grad_clip_norm", "-1"});
  bad([&](adam_params& h) { h.grad_clip_norm = nan; }, {"grad_clip_norm", "nan"});
  EXPECT_NO_THROW(validate(adam_params{}));

  // A step with bad hyper-parameters changes nothing.
  auto params = make_params(6);
  set_grads(params, 6);
  auto before = clone_params(params);
  adamw opt;
  adam_params hp;
  hp.beta2 = 1.0;
  expect_error([&] { opt.step(params, hp); }, error_code::invalid_argument, {"beta2"});
  EXPECT_EQ(max_abs_diff(params, before), 0.0);
  EXPECT_EQ(opt.state_of("a.weight"), nullptr);
}

TEST(AdamW, StepRejectsBadParameters) {
  adamw opt;
  adam_params hp;
  expect_error(
      [&] {
        opt.step({{"w", at::Tensor()}}, hp);
      },
      error_code::invalid_argument, {"'w'", "undefined"});
  expect_error(
      [&] {
        opt.step({{"w", leaf(at::zeros({2}, at::kDouble))}}, hp);
      },
      error_code::invalid_argument, {"'w'", "float32", "Double"});
  auto w = leaf(at::zeros({2}));
  w.mutable_grad() = at::ones({2});
  expect_error(
      [&] {
        opt.step({{"w", w}, {"w", w}}, hp);
      },
      error_code::invalid_argument, {"'w'", "twice"});
  auto g = leaf(at::zeros({2}));
  g.mutable_grad() = at::ones({3});
  expect_error(
      [&] {
        opt.step({{"g", g}}, hp);
      },
      error_code::invalid_argument, {"gradient of 'g'", "[3]", "[2]"});
  auto h = leaf(at::zeros({2}));
  h.mutable_grad() = at::ones({2}, at::kDouble);
  expect_error(
      [&] {
        opt.step({{"h", h}}, hp);
      },
      error_code::invalid_argument, {"gradient of 'h'", "float32"});
  opt.step({{"w", w}}, hp);
  auto wider = leaf(at::zeros({3}));
  wider.mutable_grad() = at::ones({3});
  expect_error(
      [&] {
        opt.step({{"w", wider}}, hp);
      },
      error_code::invalid_argument, {"'w'", "[3]", "optimizer state has shape [2]"});
}

TEST(AdamW, ZeroGradDropsOrZeroesGradients) {
  auto params = make_params(7);
  set_grads(params, 7);
  zero_grad(params, false);
  for (const auto& [name, p] : params) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0) << name;
  }
  zero_grad(params);
  for (const auto& [name, p] : params)
    EXPECT_FALSE(p.grad().defined()) << name;
  EXPECT_EQ(global_grad_norm(params), 0.0);
}

TEST(AdamW, StateRoundTripContinuesBitForBit) {
  auto a = make_params(8);
  adamw opt_a;
  adam_params hp;
  hp.learning_rate = 3e-3;
  hp.weight_decay = 0.01;
  for (uint64_t s = 0; s < 2; ++s) {
    set_grads(a, 20 + s);
    opt_a.step(a, hp);
  }
  auto b = clone_params(a);
  adamw opt_b;
  opt_b.load_state(opt_a.state());
  EXPECT_EQ(opt_b.last_params(), hp);
  for (uint64_t s = 2; s < 4; ++s) {
    set_grads(a, 20 + s);
    set_grads(b, 20 + s);
    opt_a.step(a, hp);
    opt_b.step(b, hp);
  }
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  // The copy is deep: stepping one optimizer leaves a saved state alone.
  auto saved = opt_a.state();
  auto saved_avg = saved.params.at("a.bias").exp_avg.clone();
  set_grads(a, 99);
  opt_a.step(a, hp);
  EXPECT_TRUE(at::equal(saved.params.at("a.bias").exp_avg, saved_avg));
  opt_a.reset();
  EXPECT_EQ(opt_a.state_of("a.bias"), nullptr);
}

TEST(AdamW, LoadStateRejectsMalformedState) {
  adamw opt;
  auto good = [] {
    adamw_state s;
    s.params["w"] = adamw_param_state{at::zeros({2}), at::zeros({2}), 3};
    return s;
  };
  auto s = good();
  s.params["w"].exp_avg = at::Tensor();
  expect_error([&] { opt.load_state(s); }, error_code::invalid_argument, {"'w'", "exp_avg"});
  s = good();
  s.params["w"].exp_avg_sq = at::zeros({2}, at::kDouble);
  expect_error([&] { opt.load_state(s); }, error_code::invalid_argument,
               {"'w'", "exp_avg_sq", "float32"});
  s = good();
  s.params["w"].exp_avg_sq = at::zeros({3});
  expect_error([&] { opt.load_state(s); }, error_code::invalid_argument, {"'w'", "[2]", "[3]"});
  s = good();
  s.params["w"].step = -1;
  expect_error([&] { opt.load_state(s); }, error_code::invalid_argument, {"'w'", "step -1"});
  s = good();
  s.last_params.eps = -1;
  expect_error([&] { opt.load_state(s); }, error_code::invalid_argument, {"eps"});
  expect_error([&] { validate(s); }, error_code::invalid_argument, {"eps"});
  EXPECT_NO_THROW(validate(good()));
  EXPECT_EQ(opt.state_of("w"), nullptr); // nothing was loaded
  opt.load_state(good());
  EXPECT_EQ(opt.state_of("w")->step, 3);
}

TEST(AdamW, TakeAndPutStateMoveTheTensorsAndContinueBitForBit) {
  auto a = make_params(9);
  auto b = clone_params(a);
  adamw opt_a, opt_b;
  adam_params hp;
  hp.learning_rate = 2e-3;
  hp.weight_decay = 0.1;
  for (uint64_t s = 0; s < 2; ++s) {
    set_grads(a, 40 + s);
    set_grads(b, 40 + s);
    opt_a.step(a, hp);
    opt_b.step(b, hp);
  }
  const void* avg = opt_a.state_of("a.weight")->exp_avg.data_ptr();
  auto taken = opt_a.take_state();
  // Moved, not copied: the same storage, and the optimizer is left empty.
  EXPECT_EQ(taken.params.at("a.weight").exp_avg.data_ptr(), avg);
  EXPECT_EQ(taken.params.size(), 3u);
  EXPECT_EQ(taken.params.at("a.weight").step, 2);
  EXPECT_EQ(taken.last_params, hp);
  EXPECT_EQ(opt_a.state_of("a.weight"), nullptr);
  EXPECT_EQ(opt_a.last_params(), adam_params{});
  EXPECT_TRUE(opt_a.take_state().params.empty());
  opt_a.put_state(std::move(taken));
  EXPECT_EQ(opt_a.state_of("a.weight")->exp_avg.data_ptr(), avg);
  EXPECT_EQ(opt_a.last_params(), hp);
  for (uint64_t s = 2; s < 4; ++s) {
    set_grads(a, 40 + s);
    set_grads(b, 40 + s);
    opt_a.step(a, hp);
    opt_b.step(b, hp);
  }
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
}

TEST(AdamW, PutStateRejectsMalformedStateAndKeepsItsOwn) {
  auto params = make_params(10);
  adamw opt;
  set_grads(params, 50);
  opt.step(params, adam_params{});
  auto avg = opt.state_of("a.bias")->exp_avg.clone();
  adamw_state bad;
  bad.params["w"] = adamw_param_state{at::zeros({2}), at::zeros({2}, at::kDouble), 1};
  expect_error([&] { opt.put_state(bad); }, error_code::invalid_argument,
               {"'w'", "exp_avg_sq", "float32"});
  bad.params["w"].exp_avg_sq = at::zeros({2});
  bad.params["w"].step = -2;
  expect_error([&] { opt.put_state(bad); }, error_code::invalid_argument, {"'w'", "step -2"});
  bad.params["w"].step = 1;
  bad.last_params.beta2 = 1.0;
  expect_error([&] { opt.put_state(bad); }, error_code::invalid_argument, {"beta2"});
  ASSERT_NE(opt.state_of("a.bias"), nullptr);
  EXPECT_TRUE(at::equal(opt.state_of("a.bias")->exp_avg, avg));
  EXPECT_EQ(opt.state_of("w"), nullptr);
}

TEST(LrSchedule, ConstantAndWarmupFollowTheirFormulas) {
  lr_schedule constant(lr_schedule_config{lr_schedule_kind::constant, 0.5, 3, 0, 0.0});
  for (int64_t t : {0, 1, 5, 1000})
    EXPECT_EQ(constant.lr_at(t), 0.5);
  lr_schedule warm(lr_schedule_config{lr_schedule_kind::constant_with_warmup, 2.0, 4, 0, 0.0});
  const double expected[] = {0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0};
  for (int64_t t = 0; t < 7; ++t) {
    EXPECT_DOUBLE_EQ(warm.lr(), expected[t]) << "step " << t;
    EXPECT_EQ(warm.step(), t);
    warm.advance();
  }
}

TEST(LrSchedule, CosineDecaysToTheFloorAfterWarmup) {
  lr_schedule cosine(lr_schedule_config{lr_schedule_kind::cosine, 1.0, 2, 10, 0.1});
  EXPECT_DOUBLE_EQ(cosine.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(cosine.lr_at(1), 0.5);
  EXPECT_DOUBLE_EQ(cosine.lr_at(2), 1.0);
  EXPECT_NEAR(cosine.lr_at(6), 0.1 + 0.9 * 0.5, 1e-12); // halfway
  EXPECT_NEAR(cosine.lr_at(4), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_NEAR(cosine.lr_at(10), 0.1, 1e-12);
  EXPECT_NEAR(cosine.lr_at(50), 0.1, 1e-12);
  for (int64_t t = 3; t < 12; ++t)
    EXPECT_LE(cosine.lr_at(t), cosine.lr_at(t - 1)) << "step " << t;
}

TEST(LrSchedule, JsonRoundTripKeepsConfigAndStep) {
  lr_schedule s(lr_schedule_config{lr_schedule_kind::cosine, 3e-4, 5, 100, 0.25});
  for (int i = 0; i < 17; ++i)
    s.advance();
  auto back = lr_schedule::from_json(s.to_json());
  EXPECT_EQ(back.config(), s.config());
  EXPECT_EQ(back.step(), 17);
  EXPECT_EQ(back.lr(), s.lr());
}

TEST(LrSchedule, RejectsBadConfigsAndStates) {
  auto bad = [](lr_schedule_config c, std::vector<std::string> fragments) {
    expect_error([&] { lr_schedule s(c); }, error_code::invalid_argument, fragments);
  };
  bad({lr_schedule_kind::constant, -1.0, 0, 0, 0.0}, {"base_lr", "-1"});
  bad({lr_schedule_kind::constant, std::nan(""), 0, 0, 0.0}, {"base_lr", "nan"});
  bad({lr_schedule_kind::constant_with_warmup, 1.0, -2, 0, 0.0}, {"warmup_steps", "-2"});
  bad({lr_schedule_kind::cosine, 1.0, 0, 0, 0.0}, {"total_steps", "0"});
  bad({lr_schedule_kind::cosine, 1.0, 11, 10, 0.0}, {"warmup_steps", "11", "total_steps (10)"});
  bad({lr_schedule_kind::cosine, 1.0, 0, 10, 1.5}, {"min_lr_ratio", "1.5"});
  expect_error([] { parse_lr_schedule_kind("linear"); }, error_code::invalid_argument,
               {"'linear'", "cosine"});
  EXPECT_EQ(parse_lr_schedule_kind("constant_with_warmup"), lr_schedule_kind::constant_with_warmup);
  EXPECT_EQ(parse_lr_schedule_kind("linear_warmup"), lr_schedule_kind::constant_with_warmup);
  EXPECT_EQ(parse_lr_schedule_kind("cosine"), lr_schedule_kind::cosine);

  lr_schedule s(lr_schedule_config{lr_schedule_kind::cosine, 1.0, 1, 10, 0.0});
  auto j = s.to_json();
  auto missing = j;
  missing.erase("total_steps");
  expect_error([&] { lr_schedule::from_json(missing); }, error_code::decode_error,
               {"'total_steps'", "missing"});
  auto typed = j;
  typed["step"] = "three";
  expect_error([&] { lr_schedule::from_json(typed); }, error_code::decode_error,
               {"'step'", "wrong type"});
  auto negative = j;
  negative["step"] = -3;
  expect_error([&] { lr_schedule::from_json(negative); }, error_code::decode_error, {"step -3"});
  auto kind = j;
  kind["kind"] = "exponential";
  expect_error([&] { lr_schedule::from_json(kind); }, error_code::decode_error, {"'exponential'"});
  expect_error([] { lr_schedule::from_json(nlohmann::json::array()); }, error_code::decode_error,
               {"missing"});
  auto invalid = j;
  invalid["warmup_steps"] = 20;
  expect_error([&] { lr_schedule::from_json(invalid); }, error_code::invalid_argument,
               {"warmup_steps", "20"});
}
