// The policy, critic and ref worker kinds on a real actor system, driven through the dispatcher
// and the blocking trainer_client: outputs against direct computations with the backends,
// gradient accumulation, the optimizer step, learning rates, and refusal of bad input with the
// worker staying alive and its state intact.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/batch_wire.hpp"
#include "actors/dispatcher.hpp"
#include "actors/tensor_convert.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/tinker_batch.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "test_support.hpp"
#include "tinker/datum_check.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;
namespace fs = std::filesystem;

namespace {

using test::max_abs_diff;
using test::virtual_pg;

/// Rows of a small synthetic batch: prompt i has 3 + i % 3 tokens, response i has 2 + i % 4.
be::training_batch make_batch(int64_t rows, uint64_t seed, bool rl_inputs) {
  std::vector<std::vector<int64_t>> prompts, responses;
  be::per_token_values per_token;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int64_t i = 0; i < rows; ++i) {
    auto p = at::randint(1, 500, {3 + i % 3}, gen, at::kLong);
    auto r = at::randint(1, 500, {2 + i % 4}, gen, at::kLong);
    prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    responses.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
    if (rl_inputs) {
      std::vector<float> adv, old, ret, val;
      for (size_t t = 0; t < responses.back().size(); ++t) {
        adv.push_back(static_cast<float>((i % 2 ? 1.0 : -0.5) * (1.0 + 0.1 * t)));
        old.push_back(static_cast<float>(-6.24 - 0.002 * t)); // r = exp(logp - old) near 1, away from the clip edges
        ret.push_back(static_cast<float>(0.3 * i - 0.1 * t));
        val.push_back(static_cast<float>(0.01 * t));
      }
      per_token["advantages"].push_back(adv);
      per_token["action_log_probs"].push_back(old);
      per_token["returns"].push_back(ret);
      per_token["values"].push_back(val);
    }
  }
  return be::from_sequences(prompts, responses, per_token);
}

model_spec tiny_spec(uint64_t seed) {
  model_spec s;
  s.compute_dtype = "fp32"; // these tests compare fp32 numerics to 1e-5 or tighter
  s.preset = "tiny";
  s.seed = seed;
  s.learning_rate = 5e-3;
  return s;
}

using test::temp_dir;

class Workers : public test::actor_fixture {
protected:
  /// Spawns a group of `kind` under `role`, initialises its model and registers it.
  void add_role(const std::string& role, const std::string& kind, int ranks,
                const model_spec& spec) {
    auto g = spawn_group(role, kind, ranks);
    ASSERT_TRUE(g) << sys_->render(g.error());
    auto n = client_->register_group(role, *g);
    ASSERT_TRUE(n) << sys_->render(n.error());
    ASSERT_EQ(*n, ranks);
    auto params = client_->init_model(role, spec);
    ASSERT_TRUE(params) << sys_->render(params.error());
  }

  using actor_fixture::ok;

  void ok(caf::expected<void> x) { EXPECT_TRUE(x) << sys_->render(x.error()); }

  /// Expects an error of `code` whose text contains every fragment.
  template <class T>
  void expect_error(const caf::expected<T>& x, errc code, std::vector<std::string> fragments) {
    ASSERT_FALSE(x) << "expected an error";
    EXPECT_TRUE(is(x.error(), code)) << sys_->render(x.error());
    auto text = sys_->render(x.error());
    for (auto& f : fragments)
      EXPECT_NE(text.find(f), std::string::npos) << "'" << f << "' not in: " << text;
  }
};

/// The reference computation: the same model built directly with the backends.
std::unique_ptr<be::causal_lm> local_model(uint64_t seed, bool value_head) {
  auto m = be::causal_lm::random(be::preset("tiny"), seed);
  if (value_head)
    m->add_value_head(seed + 2);
  return m;
}

at::Tensor local_logprobs(be::causal_lm& m, const be::training_batch& b) {
  c10::NoGradGuard no_grad;
  auto r = be::sequence_logprobs(m, b.get("sequences"), b.get("attention_mask"));
  return be::response_columns(r.logprobs, b.response_length)
         * b.get("response_mask").to(at::kFloat);
}

rlforge::tinker::adam_params adam(double lr) {
  rlforge::tinker::adam_params r;
  r.learning_rate = lr;
  return r;
}

/// AdamW's first step moves every weight by about ±lr whatever the gradient's size, so two
/// gradients that differ only by float rounding (~1e-7 relative) near zero could move a weight
/// in opposite directions. With eps = 1 the first update is lr·g/(|g| + 1): at most lr times
/// the gradient, so weight differences measure gradient differences.
rlforge::tinker::adam_params linear_adam(double lr) {
  auto r = adam(lr);
  r.eps = 1.0;
  return r;
}

} // namespace

TEST_F(Workers, ForwardMatchesTheBackendsForPolicyRefAndCritic) {
  add_role("policy", "policy", 1, tiny_spec(3));
  add_role("ref", "ref", 1, tiny_spec(3));
  add_role("critic", "critic", 1, tiny_spec(3));
  auto batch = make_batch(4, 1, false);
  auto model = local_model(3, true);
  auto expected = local_logprobs(*model, batch);
  auto pol = ok(client_->forward("policy", batch));
  auto ref = ok(client_->forward("ref", batch));
  EXPECT_LT(max_abs_diff(pol.outputs.at("logprobs"), expected), 1e-5);
  EXPECT_TRUE(at::equal(pol.outputs.at("logprobs"), ref.outputs.at("logprobs")));
  ASSERT_TRUE(pol.outputs.count("entropy"));
  EXPECT_GT(pol.outputs.at("entropy").sum().item<double>(), 0.0);

  auto crit = ok(client_->forward("critic", batch));
  c10::NoGradGuard no_grad;
  const auto& mask = batch.get("attention_mask");
  auto hidden = model->forward_hidden(batch.get("sequences"), mask,
                                      (mask.cumsum(1) - 1).clamp_min(0));
  auto v = model->values(hidden);
  auto want = v.narrow(1, v.size(1) - 1 - batch.response_length, batch.response_length)
              * batch.get("response_mask").to(at::kFloat);
  EXPECT_LT(max_abs_diff(crit.outputs.at("values"), want), 1e-5);
}

TEST_F(Workers, CrossEntropyLossIsTheMaskedSumAndTrainingLowersIt) {
  add_role("policy", "policy", 1, tiny_spec(4));
  auto batch = make_batch(4, 2, false);
  auto fwd = ok(client_->forward("policy", batch));
  auto mask = batch.get("loss_mask");
  double want = -(fwd.outputs.at("logprobs") * mask).sum().item<double>();
  auto first = ok(client_->forward_backward("policy", batch, "cross_entropy"));
  EXPECT_NEAR(first.metric("loss:sum"), want, 1e-3 * std::abs(want));
  EXPECT_NEAR(first.outputs.at("elementwise_loss").sum().item<double>(), want,
              1e-3 * std::abs(want));
  EXPECT_LT(max_abs_diff(first.outputs.at("logprobs"), fwd.outputs.at("logprobs")), 1e-5);
  auto step = ok(client_->optim_step("policy", adam(1e-2)));
  EXPECT_FALSE(step.skipped);
  EXPECT_GT(step.grad_norm, 0.0);
  EXPECT_EQ(step.step, 1);
  double last = first.metric("loss:sum");
  for (int i = 0; i < 5; ++i) {
    last = ok(client_->forward_backward("policy", batch, "cross_entropy")).metric("loss:sum");
    ok(client_->optim_step("policy", adam(1e-2)));
  }
  EXPECT_LT(last, 0.8 * first.metric("loss:sum"));
}

TEST_F(Workers, MicroBatchesAccumulateTheSameGradients) {
  add_role("whole", "policy", 1, tiny_spec(5));
  add_role("micro", "policy", 1, tiny_spec(5));
  algorithm_config micro;
  micro.micro_batch_size = 1;
  ok(client_->set_algorithm_config("micro", micro));
  auto batch = make_batch(5, 3, true);
  auto a = ok(client_->forward_backward("whole", batch, "regular"));
  auto b = ok(client_->forward_backward("micro", batch, "regular"));
  EXPECT_NEAR(a.metric("loss:sum"), b.metric("loss:sum"), 1e-4);
  EXPECT_NEAR(a.metric("clip_ratio:mean"), b.metric("clip_ratio:mean"), 1e-6);
  auto sa = ok(client_->optim_step("whole", linear_adam(1e-2)));
  auto sb = ok(client_->optim_step("micro", linear_adam(1e-2)));
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-5 * sa.grad_norm);
  temp_dir dir;
  ok(client_->save_hf_model("whole", dir.str() + "/whole"));
  ok(client_->save_hf_model("micro", dir.str() + "/micro"));
  auto wa = be::causal_lm::load(dir.str() + "/whole")->state_dict();
  auto wb = be::causal_lm::load(dir.str() + "/micro")->state_dict();
  auto w0 = local_model(5, false)->state_dict();
  ASSERT_EQ(wa.size(), wb.size());
  double moved = 0;
  for (auto& [name, t] : wa) {
    EXPECT_LT(max_abs_diff(t, wb.at(name)), 1e-6) << name;
    moved = std::max(moved, max_abs_diff(t, w0.at(name)));
  }
  EXPECT_GT(moved, 1e-3); // the step really moved the weights
}

// Padding-free micro-batches (rows sorted by length under a token budget, each trimmed) and
// activation checkpointing change how the pass is computed, not what it computes: the same
// losses, metrics (KL and entropy regularizers included) and updated weights as one padded
// pass, to 1e-6 in fp32.
TEST_F(Workers, PaddingFreeMicroBatchesAndCheckpointingGiveThePaddedPassResults) {
  add_role("padded", "policy", 1, tiny_spec(15));
  add_role("packed", "policy", 1, tiny_spec(15));
  auto batch = make_batch(7, 9, true);
  auto ref = ok(client_->forward("padded", batch)).outputs.at("logprobs");
  batch.tensors["base_action_log_probs"] = ref - 0.05 * batch.get("response_mask").to(at::kFloat);
  algorithm_config padded;
  padded.use_kl_loss = true;
  padded.kl_loss_coef = 0.3;
  padded.use_entropy_loss = true;
  auto packed = padded;
  packed.max_tokens_per_micro_batch = 16; // a few rows of 5-10 tokens each
  packed.gradient_checkpointing = true;
  ok(client_->set_algorithm_config("padded", padded));
  ok(client_->set_algorithm_config("packed", packed));
  auto a = ok(client_->forward_backward("padded", batch, "regular"));
  auto b = ok(client_->forward_backward("packed", batch, "regular"));
  for (const char* m : {"loss:sum", "total_loss:sum", "kl:mean", "kl_loss:mean",
                        "entropy_loss:mean", "clip_ratio:mean", "entropy:mean"})
    EXPECT_NEAR(a.metric(m), b.metric(m), 1e-6 * std::max(1.0, std::abs(a.metric(m)))) << m;
  // Per-token outputs (log-probs near -6) to 1e-6 relative: fp32 rounding of other GEMM shapes.
  for (const char* o : {"logprobs", "elementwise_loss", "entropy"}) {
    auto scale = std::max(1.0, a.outputs.at(o).abs().max().item<double>());
    EXPECT_LT(max_abs_diff(a.outputs.at(o), b.outputs.at(o)), 1e-6 * scale) << o;
  }
  auto sa = ok(client_->optim_step("padded", linear_adam(1e-2)));
  auto sb = ok(client_->optim_step("packed", linear_adam(1e-2)));
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-6 * sa.grad_norm);
  temp_dir dir;
  ok(client_->save_hf_model("padded", dir.str() + "/padded"));
  ok(client_->save_hf_model("packed", dir.str() + "/packed"));
  auto wa = be::causal_lm::load(dir.str() + "/padded")->state_dict();
  auto wb = be::causal_lm::load(dir.str() + "/packed")->state_dict();
  for (auto& [name, t] : wa)
    EXPECT_LT(max_abs_diff(t, wb.at(name)), 1e-6) << name;
  packed.max_tokens_per_micro_batch = -1;
  expect_error(client_->set_algorithm_config("packed", packed), errc::invalid_argument,
               {"max_tokens_per_micro_batch must be >= 0, got -1"});
}

namespace {

namespace tk = rlforge::tinker;

/// An importance-sampling datum of `n` input tokens drawn from `seed`.
tk::datum rl_datum(int64_t n, int64_t seed) {
  tk::datum d;
  tk::tensor_data targets{tk::dtype::int64, {n}, {}, {}};
  tk::tensor_data logprobs{tk::dtype::float32, {n}, {}, {}};
  tk::tensor_data advantages{tk::dtype::float32, {n}, {}, {}};
  for (int64_t t = 0; t < n; ++t) {
    d.tokens.push_back((seed * 37 + t * 11) % 400 + 1);
    targets.ints.push_back((seed * 13 + t * 7) % 400 + 1);
    logprobs.floats.push_back(-6.2 - 0.01 * static_cast<double>(t));
    advantages.floats.push_back(seed % 2 ? 1.0 : -0.5);
  }
  d.loss_fn_inputs["target_tokens"] = targets;
  d.loss_fn_inputs["logprobs"] = logprobs;
  d.loss_fn_inputs["advantages"] = advantages;
  return d;
}

tk::checked_request checked(const std::string& model, std::vector<tk::datum> data,
                            bool forward_only) {
  tk::forward_backward_request r;
  r.model_id = model;
  r.data = std::move(data);
  r.loss_fn = "importance_sampling";
  r.forward_only = forward_only;
  return tk::check_request(r, tk::model_role::policy, {be::preset("tiny").vocab_size, 0}, "test");
}

} // namespace

// A checked Tinker request computes exactly what the RL API's `forward_backward` computes on the
// batch its datums make (the worker builds the same tensors and only skips the checks): the same
// per-datum outputs, metrics and gradients, bit for bit. Split over two data-parallel ranks (a
// slice of the datums each; a rank with none answers nothing) it is the same work in two parts.
TEST_F(Workers, ATinkerRequestComputesWhatTheBatchOfItsDatumsComputes) {
  add_role("batch", "policy", 1, tiny_spec(21));
  add_role("tinker", "policy", 1, tiny_spec(21));
  add_role("split", "policy", 2, tiny_spec(21));
  add_role("ref", "ref", 1, tiny_spec(21));
  std::vector<tk::datum> data{rl_datum(5, 1), rl_datum(3, 2), rl_datum(7, 3)};
  std::vector<const tk::datum*> rows;
  std::vector<int64_t> lengths;
  for (auto& d : data) {
    rows.push_back(&d);
    lengths.push_back(static_cast<int64_t>(d.tokens.size()));
  }
  auto via_batch =
      ok(client_->forward_backward("batch", be::batch_from_datums(rows), "importance_sampling"));
  auto want = be::datum_outputs({{"logprobs", via_batch.outputs.at("logprobs")},
                                 {"elementwise_loss", via_batch.outputs.at("elementwise_loss")}},
                                lengths);
  auto got = ok(
      client_->call("tinker", worker_ops::tinker_forward_backward, checked("tinker", data, false)));
  EXPECT_EQ(got.datum_outputs, want);
  EXPECT_EQ(got.tokens, via_batch.tokens);
  for (auto& [name, value] : via_batch.metrics) {
    if (name != "loss:sum") {
      EXPECT_EQ(got.metrics.at(name), value) << name;
    }
  }
  double sum = 0;
  for (auto& d : got.datum_outputs)
    for (double x : d.at("elementwise_loss").floats)
      sum += x;
  EXPECT_EQ(got.metrics.at("loss:sum"), sum);
  EXPECT_NEAR(sum, via_batch.metric("loss:sum"), 1e-5 * std::abs(sum));
  // Without gradients, on a policy or a reference: the same outputs.
  auto forward =
      ok(client_->call("tinker", worker_ops::tinker_forward, checked("tinker", data, true)));
  EXPECT_EQ(forward.datum_outputs, want);
  auto ref = ok(client_->call("ref", worker_ops::tinker_forward, checked("ref", data, true)));
  EXPECT_EQ(ref.datum_outputs, want);
  // The gradients accumulated are the same: one step moves both models alike.
  auto step_batch = ok(client_->optim_step("batch", linear_adam(1e-2)));
  auto step_tinker = ok(client_->optim_step("tinker", linear_adam(1e-2)));
  EXPECT_EQ(step_tinker.grad_norm, step_batch.grad_norm);
  EXPECT_GT(step_batch.grad_norm, 0.0);

  // Two ranks: datums [0, 1) and [1, 3).
  auto split = ok(
      client_->call("split", worker_ops::tinker_forward_backward, checked("split", data, false)));
  ASSERT_EQ(split.datum_outputs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    for (const char* name : {"logprobs", "elementwise_loss"}) {
      const auto& a = split.datum_outputs[i].at(name).floats;
      const auto& b = want[i].at(name).floats;
      ASSERT_EQ(a.size(), b.size());
      for (size_t t = 0; t < a.size(); ++t)
        EXPECT_NEAR(a[t], b[t], 1e-5) << "datum " << i << " " << name << " " << t;
    }
  EXPECT_NEAR(split.metrics.at("loss:sum"), sum, 1e-5 * std::abs(sum));
  EXPECT_EQ(split.tokens, via_batch.tokens);
  // One datum on two ranks (before the step): rank 0 gets none.
  auto one =
      ok(client_->call("split", worker_ops::tinker_forward, checked("split", {data[2]}, true)));
  ASSERT_EQ(one.datum_outputs.size(), 1u);
  const auto& a = one.datum_outputs[0].at("logprobs").floats;
  const auto& b = want[2].at("logprobs").floats;
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t)
    EXPECT_NEAR(a[t], b[t], 1e-5) << t;
  auto step_split = ok(client_->optim_step("split", linear_adam(1e-2)));
  EXPECT_NEAR(step_split.grad_norm, step_batch.grad_norm, 1e-5 * step_batch.grad_norm);
}

// The dispatcher refuses a Tinker request of the wrong type or without datums before any rank
// sees it; the workers stay usable.
TEST_F(Workers, ATinkerCallWithoutARequestOrDatumsIsRefused) {
  add_role("policy", "policy", 1, tiny_spec(22));
  auto wrong = client_->call("policy", worker_ops::tinker_forward_backward.id,
                             caf::make_message(std::string{"datums"}));
  expect_error(wrong, errc::invalid_argument,
               {"tinker_forward_backward", "expects (checked_request)"});
  auto empty = client_->call("policy", worker_ops::tinker_forward.id,
                             caf::make_message(tk::checked_request{}));
  expect_error(empty, errc::invalid_argument, {"tinker_forward", "without datums"});
  auto fine = client_->call("policy", worker_ops::tinker_forward,
                            checked("policy", {rl_datum(4, 5)}, true));
  ok(fine);
}

TEST_F(Workers, NonFiniteGradientNormSkipsTheStepAndSaysSo) {
  add_role("policy", "policy", 1, tiny_spec(6));
  auto batch = make_batch(3, 4, true);
  auto before = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  // Finite inputs whose gradient overflows float32: -r·A with A = 3e38 on every token.
  auto huge = batch;
  huge.tensors["advantages"] = at::full_like(batch.get("advantages"), 3e38f);
  ok(client_->forward_backward("policy", huge, "importance_sampling"));
  auto step = ok(client_->optim_step("policy", adam(1e-2)));
  EXPECT_TRUE(step.skipped);
  EXPECT_FALSE(std::isfinite(step.grad_norm));
  EXPECT_EQ(step.step, 0);
  auto after = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  EXPECT_TRUE(at::equal(before, after));
  // The gradients were cleared: a normal step now applies.
  ok(client_->forward_backward("policy", batch, "importance_sampling"));
  auto next = ok(client_->optim_step("policy", adam(1e-2)));
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.grad_norm));
  EXPECT_EQ(next.step, 1);
}

TEST_F(Workers, LearningRateComesFromTheRequestTheScheduleOrSetLr) {
  auto spec = tiny_spec(7);
  spec.lr_schedule = "constant_with_warmup";
  spec.learning_rate = 1e-2;
  spec.warmup_steps = 4;
  add_role("policy", "policy", 1, spec);
  auto batch = make_batch(2, 5, false);
  std::vector<double> lrs;
  for (int i = 0; i < 3; ++i) {
    ok(client_->forward_backward("policy", batch, "cross_entropy"));
    lrs.push_back(ok(client_->optim_step("policy", adam(-1))).learning_rate);
  }
  EXPECT_DOUBLE_EQ(lrs[0], 0.0);
  EXPECT_DOUBLE_EQ(lrs[1], 1e-2 * 1 / 4);
  EXPECT_DOUBLE_EQ(lrs[2], 1e-2 * 2 / 4);
  ok(client_->set_lr("policy", 0.02));
  ok(client_->forward_backward("policy", batch, "cross_entropy"));
  EXPECT_DOUBLE_EQ(ok(client_->optim_step("policy", adam(-1))).learning_rate, 0.02 * 3 / 4);
  ok(client_->forward_backward("policy", batch, "cross_entropy"));
  EXPECT_DOUBLE_EQ(ok(client_->optim_step("policy", adam(3e-4))).learning_rate, 3e-4);
  expect_error(client_->set_lr("policy", -1.0), errc::invalid_argument, {"set_lr", "-1"});
}

TEST_F(Workers, KlLossAndEntropyBonusReportTheirMetrics) {
  add_role("policy", "policy", 1, tiny_spec(8));
  auto batch = make_batch(3, 6, true);
  auto ref = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  batch.tensors["base_action_log_probs"] = ref - 0.1 * batch.get("response_mask").to(at::kFloat);
  algorithm_config a;
  a.use_kl_loss = true;
  a.kl_estimator = "k1";
  a.kl_loss_coef = 0.5;
  a.use_entropy_loss = true;
  ok(client_->set_algorithm_config("policy", a));
  auto out = ok(client_->forward_backward("policy", batch, "regular"));
  // k1 = logp - ref = 0.1 on every valid token; KL loss = coef · mean over rows of row means.
  EXPECT_NEAR(out.metric("kl:mean"), 0.1, 1e-4);
  EXPECT_NEAR(out.metric("kl_loss:mean"), 0.05, 1e-4);
  EXPECT_TRUE(out.metrics.count("entropy_loss:mean"));
  a.kl_estimator = "k9";
  expect_error(client_->set_algorithm_config("policy", a), errc::invalid_argument, {"k9"});
}

TEST_F(Workers, BadInputIsRefusedAndTheWorkerStaysUsableWithItsStateIntact) {
  add_role("policy", "policy", 1, tiny_spec(9));
  add_role("control", "policy", 1, tiny_spec(9));
  add_role("critic", "critic", 1, tiny_spec(9));
  auto batch = make_batch(4, 7, true);
  auto payload = ok(to_payload(batch));
  const int64_t rows = 4, r = batch.response_length;
  int goods = 0;
  auto good = [&] {
    ++goods;
    auto out = client_->forward_backward("policy", batch, "regular");
    EXPECT_TRUE(out) << sys_->render(out.error());
  };
  auto with = [&](const std::string& key, const at::Tensor& t) {
    auto p = payload;
    p.tensors[key] = ok(to_blob(t));
    return p;
  };
  auto without = [&](const std::string& key) {
    auto p = payload;
    p.tensors.erase(key);
    return p;
  };
  loss_request regular{"regular", {}, {}};
  loss_request critic_loss{"ppo_critic", {}, {}};

  // Tensors of mismatched lengths: rows, then columns.
  expect_error(client_->forward_backward("policy", with("advantages", at::zeros({rows - 1, r})),
                                         regular),
               errc::invalid_argument, {"policy", "forward_backward", "advantages", "rows"});
  good();
  expect_error(client_->forward_backward("policy", with("advantages", at::zeros({rows, r + 1})),
                                         regular),
               errc::invalid_argument, {"rank 0", "advantages"});
  good();
  // Unknown loss.
  expect_error(client_->forward_backward("policy", payload, {"ppo_typo", {}, {}}),
               errc::invalid_argument, {"ppo_typo", "regular"});
  good();
  // Inputs missing for the chosen loss.
  expect_error(client_->forward_backward("policy", without("advantages"), regular),
               errc::invalid_argument, {"advantages"});
  good();
  expect_error(client_->forward_backward("policy", without("action_log_probs"), regular),
               errc::invalid_argument, {"regular"});
  good();
  expect_error(client_->forward_backward("critic", without("returns"), critic_loss),
               errc::invalid_argument, {"critic", "returns"});
  expect_error(client_->forward_backward("critic", without("values"), critic_loss),
               errc::invalid_argument, {"critic", "ppo_critic"});
  ok(client_->forward_backward("critic", payload, critic_loss));
  // A policy loss sent to a critic and the reverse.
  expect_error(client_->forward_backward("critic", payload, regular), errc::invalid_argument,
               {"critic", "'regular' is a policy loss"});
  expect_error(client_->forward_backward("policy", payload, critic_loss), errc::invalid_argument,
               {"policy", "'ppo_critic' is a value loss"});
  good();
  ok(client_->forward_backward("critic", payload, critic_loss));
  // NaN and inf in inputs.
  auto nan_adv = batch.get("advantages").clone();
  nan_adv[1][r - 1] = std::numeric_limits<float>::quiet_NaN();
  expect_error(client_->forward_backward("policy", with("advantages", nan_adv), regular),
               errc::invalid_argument, {"advantages"});
  good();
  auto inf_old = batch.get("action_log_probs").clone();
  inf_old[0][r - 1] = -std::numeric_limits<float>::infinity();
  expect_error(client_->forward_backward("policy", with("action_log_probs", inf_old), regular),
               errc::invalid_argument, {"action_log_probs"});
  good();
  // An empty batch.
  expect_error(client_->forward_backward("policy", batch_payload{}, regular),
               errc::invalid_argument, {"empty batch"});
  auto no_rows = ok(slice_payload(payload, 0, 1));
  for (auto& [name, b] : no_rows.tensors) {
    b.shape[0] = 0;
    b.bytes.clear();
  }
  no_rows.uids.clear();
  expect_error(client_->forward("policy", ok(from_payload(no_rows))), errc::invalid_argument,
               {"empty batch"});
  good();
  // Token ids outside the vocabulary (512 for the tiny preset).
  auto ids = batch.get("sequences").clone();
  ids[2][ids.size(1) - 1] = 512;
  expect_error(client_->forward_backward("policy", with("sequences", ids), regular),
               errc::out_of_range, {"512"});
  good();
  // Bad optimizer settings: refused before anything changes.
  auto bad_adam = adam(1e-2);
  bad_adam.beta1 = 1.5;
  expect_error(client_->optim_step("policy", bad_adam), errc::invalid_argument, {"beta1"});

  // The failed calls left nothing behind: the control worker, given only the good calls (one
  // accumulated forward_backward per `good()` above), ends with the same weights.
  for (int i = 0; i < goods; ++i)
    ASSERT_TRUE(client_->forward_backward("control", batch, "regular"));
  auto s1 = ok(client_->optim_step("policy", linear_adam(1e-2)));
  auto s2 = ok(client_->optim_step("control", linear_adam(1e-2)));
  EXPECT_NEAR(s1.grad_norm, s2.grad_norm, 1e-6 * s2.grad_norm);
  auto a = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  auto b = ok(client_->forward("control", batch)).outputs.at("logprobs");
  EXPECT_LT(max_abs_diff(a, b), 1e-6);
}

TEST_F(Workers, OpsBeforeInitAndOnTheWrongKindAreErrors) {
  group_spec s;
  s.name = "raw";
  s.kind = "ref";
  s.placement = virtual_pg(1);
  s.threads_per_rank = 1;
  auto g = actor_group::spawn(*sys_, s);
  ASSERT_TRUE(g);
  groups_.push_back(*g);
  ok(client_->register_group("ref", *g));
  auto batch = make_batch(2, 8, false);
  expect_error(client_->forward("ref", batch), errc::invalid_argument,
               {"ref", "forward before init_model"});
  auto bad = tiny_spec(1);
  bad.preset = "huge";
  expect_error(client_->init_model("ref", bad), errc::not_found, {"huge"});
  bad.config_json = "{}";
  expect_error(client_->init_model("ref", bad), errc::invalid_argument, {"exactly one"});
  ok(client_->init_model("ref", tiny_spec(1)));
  ok(client_->forward("ref", batch));
  // A ref worker does not train.
  expect_error(client_->forward_backward("ref", batch, "cross_entropy"), errc::not_found,
               {"forward_backward"});
  expect_error(client_->forward("nobody", batch), errc::not_found, {"nobody", "ref"});
  ok(client_->forward("ref", batch));
}
