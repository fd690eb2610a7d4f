// The Tinker backend over the dispatcher (training side): LoRA policies and a critic on one
// shared base, SFT, importance sampling and the ppo → regular mapping, requests computed one by
// one whatever arrives with them, targets that are not the shifted inputs, the worker's loss for
// forward and forward_backward alike, the unembedding adapter (train_unembed), checkpoints with
// and without optimizer state, delete_model freeing the model, the dispatcher's unregister, and
// bad input. Sampling: tinker_sampling_test.cpp.
#include "actors/tinker_training.hpp"
#include "actors/worker.hpp"

#include <c10/core/GradMode.h>
#include "tests/actors/tinker_backend_fixture.hpp"

namespace rlforge::actors::test {
namespace {

TEST_F(DispatcherBackend, ReportsTheBaseModel) {
  EXPECT_EQ(backend_->base_model_name(), "tiny-base");
  EXPECT_EQ(backend_->vocab_size(), 512);
  EXPECT_EQ(backend_->max_context_length(), 512);
}

TEST_F(DispatcherBackend, LoraModelsShareTheBaseAndTrainIndependently) {
  backend_->create_model("a", lora(4, 1), policy);
  backend_->create_model("b", lora(4, 2), policy);
  backend_->create_model("c", lora(4, 3), critic);
  EXPECT_TRUE(backend_->has_model("a"));
  EXPECT_TRUE(backend_->has_model("c"));
  EXPECT_FALSE(backend_->has_model("d"));
  // Three models, one copy of the base: the shared entry holds exactly the base's bytes.
  EXPECT_EQ(shared_base_users(base_), 3);
  EXPECT_EQ(shared_base_bytes(base_), 139584 * 4); // the "tiny" preset's parameters, fp32

  auto b_before = logprobs("b", sft_data());
  std::vector<double> losses;
  for (int i = 0; i < 5; ++i)
    losses.push_back(sft_step("a"));
  for (size_t i = 1; i < losses.size(); ++i)
    EXPECT_LT(losses[i], losses[i - 1]) << ::testing::PrintToString(losses);
  EXPECT_LT(losses.back(), losses.front() * 0.95) << ::testing::PrintToString(losses);
  auto b_after = logprobs("b", sft_data());
  EXPECT_EQ(b_before, b_after); // training a did not touch b (nor the shared base)
  EXPECT_NE(logprobs("a", sft_data()), b_after);
}

TEST_F(DispatcherBackend, PpoIsRegularWithTinkerThresholds) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p");
  auto data = sft_data();
  auto current = logprobs("p", data);
  // Old log-probs off by ±0.3 so the clip range matters; advantages of both signs.
  for (size_t i = 0; i < data.size(); ++i) {
    std::vector<double> old, adv;
    for (size_t t = 0; t < current[i].size(); ++t) {
      old.push_back(current[i][t] + (t % 2 ? 0.3 : -0.3));
      adv.push_back(t % 3 ? 1.0 : -0.5);
    }
    data[i].loss_fn_inputs["logprobs"] = floats(old);
    data[i].loss_fn_inputs["advantages"] = floats(adv);
  }
  std::map<std::string, double> cfg{{"clip_low_threshold", 0.9}, {"clip_high_threshold", 1.1}};
  auto fwd = backend_->forward_backward({request("p", data, "ppo", cfg, true)}).at(0);
  auto fb = backend_->forward_backward({request("p", data, "ppo", cfg)}).at(0);
  double total = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    auto n = static_cast<int64_t>(current[i].size());
    auto lp = at::tensor(fwd.loss_fn_outputs[i].at("logprobs").floats).to(at::kFloat).view({1, n});
    auto old = at::tensor(data[i].loss_fn_inputs["logprobs"].floats).to(at::kFloat).view({1, n});
    auto adv = at::tensor(data[i].loss_fn_inputs["advantages"].floats).to(at::kFloat).view({1, n});
    algo::loss_inputs in;
    in.logprobs = lp;
    in.old_logprobs = old;
    in.advantages = adv;
    in.loss_mask = at::ones({1, n});
    algo::loss_config direct{{{"eps_clip_low", 0.1}, {"eps_clip_high", 0.1}}, {}};
    auto want = algo::compute_loss("regular", in, direct).elementwise.to(at::kDouble);
    for (int64_t t = 0; t < n; ++t) {
      EXPECT_NEAR(fwd.loss_fn_outputs[i].at("elementwise_loss").floats[static_cast<size_t>(t)],
                  want[0][t].item<double>(), 1e-6)
          << "datum " << i << " token " << t;
      EXPECT_NEAR(fb.loss_fn_outputs[i].at("elementwise_loss").floats[static_cast<size_t>(t)],
                  want[0][t].item<double>(), 1e-5)
          << "datum " << i << " token " << t;
    }
    ASSERT_EQ(fb.loss_fn_outputs[i].at("logprobs").floats.size(), current[i].size());
    total += want.sum().item<double>();
  }
  EXPECT_NEAR(fb.metrics.at("loss:sum"), total, 1e-4);
  EXPECT_TRUE(fb.metrics.count("clip_ratio:mean"));
  EXPECT_GT(fb.metrics.at("clip_ratio:mean"), 0.0);
  // The worker computes forward's loss as forward_backward's: the same metrics.
  for (auto& [name, value] : fb.metrics)
    EXPECT_NEAR(fwd.metrics.at(name), value, 1e-5 * std::max(1.0, std::abs(value))) << name;
  backend_->optim_step("p", tk::adam_params{});

  // importance_sampling runs and reports its ratio.
  auto is = backend_->forward_backward({request("p", data, "importance_sampling")}).at(0);
  EXPECT_TRUE(is.metrics.count("importance_ratio:mean"));
  auto m = backend_->optim_step("p", tk::adam_params{});
  EXPECT_GT(m.at("grad_norm:mean"), 0.0);
}

TEST_F(DispatcherBackend, CriticTakesOnlyValueLossesAndPolicyNever) {
  backend_->create_model("critic", lora(4), critic);
  backend_->create_model("policy", lora(4), policy);
  auto data = sft_data();
  for (auto& d : data) {
    auto n = d.tokens.size();
    d.loss_fn_inputs["values"] = floats(std::vector<double>(n, 0.1));
    d.loss_fn_inputs["returns"] = floats(std::vector<double>(n, 1.0));
  }
  std::vector<double> losses;
  for (int i = 0; i < 4; ++i) {
    auto out = backend_->forward_backward({request("critic", data, "ppo_critic")}).at(0);
    ASSERT_EQ(out.loss_fn_outputs.size(), data.size());
    EXPECT_EQ(out.loss_fn_outputs[0].at("values").floats.size(), data[0].tokens.size());
    EXPECT_FALSE(out.loss_fn_outputs[0].count("logprobs"));
    losses.push_back(out.metrics.at("loss:sum"));
    tk::adam_params p;
    p.learning_rate = 1e-2;
    backend_->optim_step("critic", p);
  }
  EXPECT_LT(losses.back(), losses.front());
  expect_refused([&] { backend_->forward_backward({request("critic", sft_data())}); }, user,
                 "'cross_entropy' is a policy loss; a critic trains only with ppo or ppo_critic");
  expect_refused([&] { backend_->forward_backward({request("policy", data, "ppo_critic")}); }, user,
                 "ppo_critic");
  expect_refused([&] { backend_->sample({}); }, user, "no requests");
  expect_refused([&] { backend_->save_sampler_snapshot("critic"); }, user, "is a critic");
  expect_refused([&] { backend_->export_sampler_weights("critic", where("cs")); }, user,
                 "is a critic");
}

TEST_F(DispatcherBackend, ABatchIsSplitPerLossAndOutputsKeepRequestOrder) {
  backend_->create_model("p", lora(4), policy);
  auto data = sft_data();
  auto current = logprobs("p", data);
  std::vector<tk::datum> is_data{data[1]};
  is_data[0].loss_fn_inputs["logprobs"] = floats(current[1]);
  is_data[0].loss_fn_inputs["advantages"] = floats(std::vector<double>(current[1].size(), 2.0));
  std::vector<tk::forward_backward_request> batch{
      request("p", {data[0]}, "cross_entropy", {}, true),
      request("p", is_data, "importance_sampling", {}, true),
      request("p", {data[2]}, "cross_entropy", {}, true)};
  auto out = backend_->forward_backward(batch);
  ASSERT_EQ(out.size(), 3u);
  // Cross-entropy per token is -logp; importance sampling at ratio 1 is -A.
  auto& ce0 = out[0].loss_fn_outputs.at(0);
  for (size_t t = 0; t < current[0].size(); ++t)
    EXPECT_NEAR(ce0.at("elementwise_loss").floats[t], -current[0][t], 1e-5);
  auto& is0 = out[1].loss_fn_outputs.at(0);
  for (size_t t = 0; t < current[1].size(); ++t)
    EXPECT_NEAR(is0.at("elementwise_loss").floats[t], -2.0, 1e-5);
  EXPECT_NEAR(out[1].metrics.at("loss:sum"), -2.0 * static_cast<double>(current[1].size()), 1e-4);
  double ce2 = 0;
  for (double x : current[2])
    ce2 -= x;
  EXPECT_NEAR(out[2].metrics.at("loss:sum"), ce2, 1e-4);
  EXPECT_EQ(out[2].loss_fn_outputs.at(0).at("logprobs").floats.size(), current[2].size());

  // Fractional and zero weights (a masked prompt), int32 targets and bfloat16 weights.
  auto weighted = data[0];
  auto n = weighted.tokens.size();
  std::vector<double> w(n, 0.5);
  w[0] = w[1] = 0;
  weighted.loss_fn_inputs["weights"] = floats(w);
  weighted.loss_fn_inputs["weights"].type = tk::dtype::bfloat16;
  weighted.loss_fn_inputs["target_tokens"].type = tk::dtype::int32;
  auto wout = backend_->forward_backward({request("p", {weighted})}).at(0);
  double wsum = 0;
  for (size_t t = 0; t < n; ++t) {
    EXPECT_NEAR(wout.loss_fn_outputs[0].at("elementwise_loss").floats[t], -w[t] * current[0][t],
                1e-5)
        << "token " << t;
    wsum -= w[t] * current[0][t];
  }
  EXPECT_NEAR(wout.metrics.at("loss:sum"), wsum, 1e-4);

  backend_->create_model("q", lora(4), policy);
  expect_refused(
      [&] {
        backend_->forward_backward({request("p", {data[0]}), request("q", {data[0]})});
      },
      user, "one model per batch");
  expect_refused(
      [&] {
        backend_->forward_backward(
            {request("p", {data[0]}), request("p", {data[0]}, "cross_entropy", {}, true)});
      },
      user, "mixes forward");
}

// Tinker scores a datum on its target_tokens, which need not be the shifted inputs: placeholder
// targets at weight-0 prompt positions are accepted, and a weighted position is scored on its
// own target.
TEST_F(DispatcherBackend, DatumsAreScoredOnTheirOwnTargets) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p", 1e-2);
  std::vector<int64_t> input = {3, 30, 300, 3, 30};
  tk::datum d;
  d.tokens = input;
  d.loss_fn_inputs["target_tokens"] = ints({0, 0, 77, 30, 123}); // 77 and 123 are not next
  d.loss_fn_inputs["weights"] = floats({0, 0, 1, 1, 0.5});
  auto out = backend_->forward_backward({request("p", {d}, "cross_entropy", {}, true)}).at(0);
  const auto& lp = out.loss_fn_outputs.at(0).at("logprobs").floats;
  const auto& el = out.loss_fn_outputs.at(0).at("elementwise_loss").floats;
  ASSERT_EQ(lp.size(), 5u);
  // Position k's log-prob of target t is the last log-prob of the sequence input[0..k] + [t].
  auto reference = [&](size_t k, int64_t t) {
    std::vector<int64_t> seq(input.begin(), input.begin() + static_cast<long>(k) + 1);
    seq.push_back(t);
    return logprobs("p", {next_tokens(seq)}).at(0).back();
  };
  EXPECT_NEAR(lp[2], reference(2, 77), 1e-5);
  EXPECT_NEAR(lp[3], reference(3, 30), 1e-5);
  EXPECT_NEAR(lp[4], reference(4, 123), 1e-5);
  EXPECT_NEAR(el[2], -lp[2], 1e-5);
  EXPECT_NEAR(el[4], -0.5 * lp[4], 1e-5);
  EXPECT_EQ(el[0], 0.0);
  EXPECT_NEAR(out.metrics.at("loss:sum"), el[2] + el[3] + el[4], 1e-5);
  // Training on such datums works too; ids outside the vocabulary are still refused.
  EXPECT_NO_THROW(backend_->forward_backward({request("p", {d})}));
  d.loss_fn_inputs["target_tokens"] = ints({0, 0, 512, 30, 1});
  expect_refused([&] { backend_->forward_backward({request("p", {d})}); }, user,
                 "target_tokens[2] = 512 is outside the vocabulary");
}

// A request's result does not depend on what arrives with it (the SDK's parallel chunks are
// batched when they are ready together), nor on how a large request is cut into worker calls.
TEST_F(DispatcherBackend, EachRequestIsComputedOnItsOwn) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p", 1e-2);
  auto a = request("p", sft_data(), "cross_entropy", {}, true);
  auto b = request("p", {next_tokens({9, 8, 7, 6})}, "cross_entropy", {}, true);
  auto alone = backend_->forward_backward({a}).at(0);
  auto together = backend_->forward_backward({b, a, b}).at(1);
  ASSERT_EQ(alone.loss_fn_outputs.size(), together.loss_fn_outputs.size());
  for (size_t i = 0; i < alone.loss_fn_outputs.size(); ++i)
    EXPECT_EQ(alone.loss_fn_outputs[i].at("logprobs").floats,
              together.loss_fn_outputs[i].at("logprobs").floats);
  EXPECT_EQ(alone.metrics, together.metrics);
  // More padded tokens than one worker call holds: the request runs in pieces of whole datums
  // and every datum's output equals its output alone.
  std::vector<tk::datum> many;
  for (int i = 0; i < 170; ++i) {
    std::vector<int64_t> seq;
    for (int k = 0; k < 400; ++k)
      seq.push_back((i * 7 + k * 13) % 500 + 1);
    many.push_back(next_tokens(seq));
  }
  ASSERT_GT(static_cast<int64_t>(many.size()) * 400, tinker_tokens_per_piece);
  auto big = backend_->forward_backward({request("p", many, "cross_entropy", {}, true)}).at(0);
  ASSERT_EQ(big.loss_fn_outputs.size(), many.size());
  double sum = 0;
  for (size_t i : {size_t{0}, size_t{100}, size_t{169}}) {
    auto single = logprobs("p", {many[i]}).at(0);
    auto got = big.loss_fn_outputs[i].at("logprobs").floats;
    ASSERT_EQ(got.size(), single.size());
    for (size_t t = 0; t < got.size(); t += 57)
      EXPECT_NEAR(got[t], single[t], 1e-5) << "datum " << i << " token " << t;
  }
  for (auto& o : big.loss_fn_outputs)
    for (double x : o.at("elementwise_loss").floats)
      sum += x;
  EXPECT_NEAR(big.metrics.at("loss:sum"), sum, 1e-6 * std::abs(sum));
}

// Tinker's train_unembed: an adapter on the unembedding (lm_head), trained, saved and loaded with
// the other adapters.
TEST_F(DispatcherBackend, TrainUnembedAdaptsTheLmHead) {
  auto unembed_only = lora(4, 5);
  unembed_only.train_attn = unembed_only.train_mlp = false;
  backend_->create_model("u", unembed_only, policy);
  auto no_unembed = lora(4, 5);
  no_unembed.train_unembed = false;
  backend_->create_model("n", no_unembed, policy);
  auto with_unembed = lora(4, 5);
  backend_->create_model("w", with_unembed, policy);
  auto before = logprobs("u", sft_data());
  for (int i = 0; i < 3; ++i) {
    sft_step("u", 1e-2);
    sft_step("n", 1e-2);
    sft_step("w", 1e-2);
  }
  // Only the lm_head adapter trains in u, and it changes the model.
  EXPECT_NE(logprobs("u", sft_data()), before);
  // The unembedding adapter makes w differ from n, which adapts the same layers without it.
  EXPECT_NE(logprobs("w", sft_data()), logprobs("n", sft_data()));
  // Saved and loaded with the other adapters: a reload reproduces the model.
  auto ckpt = where("unembed");
  fs::create_directories(ckpt.dir);
  backend_->save_checkpoint("u", ckpt, true);
  auto trained = logprobs("u", sft_data());
  sft_step("u", 1e-2);
  backend_->load_checkpoint("u", ckpt, true);
  EXPECT_EQ(logprobs("u", sft_data()), trained);
  // A checkpoint of another set of adapted parts is refused, naming both.
  expect_refused([&] { backend_->load_checkpoint("n", ckpt, true); }, user, "train_unembed");
}

TEST_F(DispatcherBackend, CheckpointsResumeBitForBitWithOptimizerAndLoadWeightsOnly) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p");
  sft_step("p");
  auto saved_state = logprobs("p", sft_data());
  auto ckpt = where("ckpt");
  fs::create_directories(ckpt.dir);
  backend_->save_checkpoint("p", ckpt, true);
  EXPECT_TRUE(fs::exists(fs::path(ckpt.dir) / "tinker_checkpoint.json"));
  sft_step("p");
  sft_step("p");
  auto continued = logprobs("p", sft_data());

  backend_->load_checkpoint("p", ckpt, true);
  EXPECT_EQ(logprobs("p", sft_data()), saved_state);
  sft_step("p");
  sft_step("p");
  EXPECT_EQ(logprobs("p", sft_data()), continued); // bit-identical resume

  // Weights only into another model of the same shape: the weights, a fresh optimizer.
  backend_->create_model("q", lora(4, 9), policy);
  backend_->load_checkpoint("q", ckpt, false);
  EXPECT_EQ(logprobs("q", sft_data()), saved_state);
  sft_step("q");
  sft_step("q");
  EXPECT_NE(logprobs("q", sft_data()), continued); // fresh moments: another trajectory

  // Saved without optimizer state: only a weights-only load is accepted.
  auto weights_only = where("weights_only");
  fs::create_directories(weights_only.dir);
  backend_->save_checkpoint("q", weights_only, false);
  expect_refused([&] { backend_->load_checkpoint("p", weights_only, true); }, user,
                 "without optimizer");
  backend_->load_checkpoint("p", weights_only, false);

  backend_->create_model("c", lora(4), critic);
  backend_->create_model("r8", lora(8), policy);
  auto attn_only = lora(4);
  attn_only.train_mlp = attn_only.train_unembed = false;
  backend_->create_model("attn", attn_only, policy);
  expect_refused([&] { backend_->load_checkpoint("c", ckpt, true); }, user, "policy with");
  expect_refused([&] { backend_->load_checkpoint("r8", ckpt, true); }, user, "LoRA rank 4");
  expect_refused([&] { backend_->load_checkpoint("attn", ckpt, true); }, user, "train_mlp");
  expect_refused([&] { backend_->load_checkpoint("p", where("missing"), true); }, user,
                 "not a training checkpoint");
  expect_refused([&] { backend_->load_checkpoint("nope", ckpt, true); }, not_found, "nope");
  // Errors name the checkpoint as the client knows it, never the server's directory.
  try {
    backend_->load_checkpoint("p", where("missing"), true);
  } catch (const tk::request_error& e) {
    EXPECT_NE(std::string{e.what()}.find("tinker://m/weights/missing"), std::string::npos);
    EXPECT_EQ(std::string{e.what()}.find(dir_.path().string()), std::string::npos) << e.what();
  }
  // The refusals left p usable and as it was.
  EXPECT_EQ(logprobs("p", sft_data()), logprobs("q", sft_data()));
}

TEST_F(DispatcherBackend, DeleteModelFreesItsActorsAndTheSharedBase) {
  backend_->create_model("a", lora(4), policy);
  backend_->create_model("b", lora(4), policy);
  backend_->save_sampler_snapshot("a");
  auto ranks = backend_->model_ranks("a");
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(shared_base_users(base_), 2);

  backend_->delete_model("a");
  EXPECT_FALSE(backend_->has_model("a"));
  EXPECT_TRUE(backend_->model_ranks("a").empty());
  EXPECT_EQ(shared_base_users(base_), 1);
  // The rank actor is gone and the dispatcher no longer knows the role.
  caf::scoped_actor self{*sys_};
  self->monitor(ranks[0]);
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; },
                caf::after(std::chrono::seconds(30)) >> [] {});
  EXPECT_TRUE(down);
  std::vector<std::string> roles;
  self->request(backend_->dispatcher(), std::chrono::seconds(10), dispatcher_roles_atom::value)
      .receive([&](std::vector<std::string>& r) { roles = r; },
               [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
  EXPECT_EQ(roles, std::vector<std::string>{"b"});
  expect_refused([&] { sft_step("a"); }, not_found, "'a'");
  expect_refused([&] { backend_->delete_model("a"); }, not_found, "'a'");

  backend_->delete_model("b");
  EXPECT_EQ(shared_base_users(base_), 0);
  EXPECT_EQ(shared_base_bytes(base_), 0);
  // The id can be used again.
  backend_->create_model("a", lora(2), policy);
  EXPECT_GT(sft_step("a"), 0.0);
}

TEST_F(DispatcherBackend, BadInputIsRefusedNamingItAndTheModelStaysUsable) {
  backend_->create_model("p", lora(4), policy);
  backend_->create_model("twin", lora(4), policy); // same seed: the same initial adapters
  expect_refused([&] { backend_->create_model("p", lora(4), policy); }, user, "already exists");
  expect_refused([&] { backend_->create_model("", lora(4), policy); }, user, "empty");
  expect_refused([&] { backend_->create_model("x", lora(-1), policy); }, user, ">= 0");
  auto none = lora(4);
  none.train_attn = none.train_mlp = none.train_unembed = false;
  expect_refused([&] { backend_->create_model("x", none, policy); }, user, "adapt nothing");
  EXPECT_FALSE(backend_->has_model("x"));

  expect_refused([&] { backend_->forward_backward({}); }, user, "empty batch");
  expect_refused([&] { backend_->forward_backward({request("nope", sft_data())}); }, not_found,
                 "nope");
  expect_refused([&] { backend_->forward_backward({request("p", {})}); }, user, "no data");
  auto bad = sft_data();
  bad[1].tokens[2] = 512;
  expect_refused([&] { backend_->forward_backward({request("p", bad)}); }, user,
                 "datum 1: model_input token 2 = 512 is outside the vocabulary [0, 512)");
  bad = sft_data();
  bad[2].loss_fn_inputs["target_tokens"].ints.back() = -3;
  expect_refused([&] { backend_->forward_backward({request("p", bad)}); }, user,
                 "datum 2 loss_fn_inputs.target_tokens[5] = -3 is a negative token id");
  expect_refused([&] { backend_->forward_backward({request("p", sft_data(), "nope")}); }, user,
                 "unknown loss_fn 'nope'");
  expect_refused(
      [&] {
        backend_->forward_backward({request("p", sft_data(), "cross_entropy", {{"beta", 1}})});
      },
      user, "beta");
  expect_refused(
      [&] {
        backend_->forward_backward(
            {request("p", sft_data(), "ppo", {{"clip_low_threshold", 1.5}})});
      },
      user, "clip_low_threshold");
  // importance_sampling without advantages: refused before any gradient.
  expect_refused(
      [&] {
        backend_->forward_backward({request("p", sft_data(), "cross_entropy"),
                                    request("p", sft_data(), "importance_sampling")});
      },
      user, "request 1");

  tk::adam_params neg;
  neg.learning_rate = -1;
  expect_refused([&] { backend_->optim_step("p", neg); }, user, "learning_rate");
  expect_refused([&] { backend_->optim_step("nope", {}); }, not_found, "nope");

  expect_refused([&] { backend_->save_sampler_snapshot("nope"); }, not_found, "nope");
  expect_refused([&] { backend_->export_sampler_weights("nope", where("x")); }, not_found, "nope");

  // Nothing above changed the model or left gradients behind: one step on p and on its
  // untouched twin gives the same weights.
  EXPECT_EQ(logprobs("p", sft_data()), logprobs("twin", sft_data()));
  EXPECT_EQ(sft_step("p"), sft_step("twin"));
  EXPECT_EQ(logprobs("p", sft_data()), logprobs("twin", sft_data()));
}

TEST_F(DispatcherBackend, OptionsAreChecked) {
  dispatcher_backend_options o;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, "base_model_dir is empty");
  o.base_model_dir = path("missing");
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, "config.json");
  o.base_model_dir = base_;
  o.threads_per_rank = 0;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, "threads_per_rank");
  o.threads_per_rank = 1;
  o.timeout = std::chrono::milliseconds(0);
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, "timeout");
  o.timeout = std::chrono::seconds(5);
  o.max_export_engines = 0;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, "max_export_engines");
  o.max_export_engines = 4;
  o.max_sampler_snapshots = 0;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, "max_sampler_snapshots");
  o.max_sampler_snapshots = 8;
  o.timeout = std::chrono::seconds(5);
  o.base_model_name = "my-base";
  auto b = make_dispatcher_backend(*sys_, o);
  EXPECT_EQ(b->base_model_name(), "my-base");

  // A base directory without weights: creating a model fails as the server's fault and leaves
  // nothing registered.
  auto no_weights = path("no_weights");
  fs::create_directories(no_weights);
  fs::copy_file(fs::path(base_) / "config.json", fs::path(no_weights) / "config.json");
  o.base_model_dir = no_weights;
  dispatcher_backend broken(*sys_, o);
  expect_refused([&] { broken.create_model("m", lora(2), policy); }, server, "create_model(m)");
  EXPECT_FALSE(broken.has_model("m"));
  caf::scoped_actor self{*sys_};
  std::vector<std::string> roles{"?"};
  self->request(broken.dispatcher(), std::chrono::seconds(10), dispatcher_roles_atom::value)
      .receive([&](std::vector<std::string>& r) { roles = r; }, [&](caf::error&) {});
  EXPECT_TRUE(roles.empty());
}

TEST_F(DispatcherBackend, DeletingAModelGivesItsPlacementShareBack) {
  node_resources n;
  n.node_id = "node0";
  n.gpus = 1;
  n.cpus = 2;
  auto mgr = spawn_placement_manager(*sys_, {n}, std::chrono::seconds(10));
  placement_client pgs{*sys_, mgr};
  auto pg = pgs.create({"tinker", {{{"GPU", 1}, {"CPU", 2}}}, "strict_pack", 0});
  ASSERT_TRUE(pg) << sys_->render(pg.error());
  dispatcher_backend_options o;
  o.base_model_dir = base_;
  o.placement = *pg;
  o.placement_manager = mgr;
  o.gpu_per_group = 0.5;
  o.timeout = std::chrono::seconds(60);
  {
    dispatcher_backend b(*sys_, o);
    b.create_model("a", lora(2), policy);
    b.create_model("b", lora(2), policy);
    // The GPU is taken by a and b: a third model does not fit, and nothing of it stays behind.
    expect_refused([&] { b.create_model("c", lora(2), policy); }, server, "GPU 0.5");
    EXPECT_FALSE(b.has_model("c"));
    b.delete_model("a");
    b.create_model("c", lora(2), policy); // a's share is back
    EXPECT_TRUE(b.has_model("c"));
  }
  caf::anon_send_exit(mgr, caf::exit_reason::user_shutdown);
}

TEST_F(DispatcherBackend, ModelsTrainConcurrentlyWithoutDisturbingEachOther) {
  backend_->create_model("a", lora(4, 1), policy);
  backend_->create_model("b", lora(4, 2), critic);
  backend_->create_model("a_alone", lora(4, 1), policy);
  auto critic_data = sft_data();
  for (auto& d : critic_data) {
    d.loss_fn_inputs["values"] = floats(std::vector<double>(d.tokens.size(), 0.0));
    d.loss_fn_inputs["returns"] = floats(std::vector<double>(d.tokens.size(), 1.0));
  }
  std::thread other([&] {
    for (int i = 0; i < 3; ++i) {
      backend_->forward_backward({request("b", critic_data, "ppo_critic")});
      backend_->optim_step("b", tk::adam_params{});
    }
  });
  for (int i = 0; i < 3; ++i)
    sft_step("a");
  other.join();
  for (int i = 0; i < 3; ++i)
    sft_step("a_alone");
  EXPECT_EQ(logprobs("a", sft_data()), logprobs("a_alone", sft_data()));
}

// -- pieces the backend adds to the runtime ----------------------------------------------------

TEST(SharedBaseWeights, LoraModelsFromOneDirectoryShareFrozenStorage) {
  temp_dir dir("shared_base");
  auto hf = (fs::path(dir.path()) / "m").string();
  be::causal_lm::random(be::preset("tiny"), 3)->save_hf(hf);
  be::lora_config l;
  l.rank = 2;
  auto a = be::causal_lm::load(hf);
  auto b = be::causal_lm::load(hf);
  a->enable_lora(l, 1);
  b->enable_lora(l, 2);
  auto ha = share_frozen_base(*a, hf);
  auto hb = share_frozen_base(*b, (fs::path(hf) / ".").string()); // same directory, other spelling
  EXPECT_EQ(shared_base_users(hf), 2);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  size_t shared = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    bool same = pa[i].second.data_ptr() == pb[i].second.data_ptr();
    EXPECT_EQ(same, !pa[i].second.requires_grad()) << pa[i].first;
    shared += same;
  }
  EXPECT_GT(shared, 0u);
  EXPECT_EQ(shared_base_bytes(hf), 139584 * 4);
  // b still computes what a fresh load computes.
  auto fresh = be::causal_lm::load(hf);
  fresh->enable_lora(l, 2);
  c10::NoGradGuard no_grad;
  auto ids = at::tensor(std::vector<int64_t>{1, 2, 3, 4}).view({1, 4});
  EXPECT_TRUE(
      at::equal(b->logits(b->forward_hidden(ids)), fresh->logits(fresh->forward_hidden(ids))));
  ha.reset();
  a.reset();
  EXPECT_EQ(shared_base_users(hf), 1);
  hb.reset();
  EXPECT_EQ(shared_base_users(hf), 0);
  EXPECT_EQ(shared_base_bytes(hf), 0);
}

class DispatcherUnregister : public actor_fixture {};

TEST_F(DispatcherUnregister, RemovesTheRoleAndRefusesUnknownOnes) {
  auto g = ok(spawn_group("g", "policy", 1));
  ok(client_->register_group("m1", g));
  ok(client_->register_group("m2", g));
  caf::scoped_actor self{*sys_};
  caf::error err;
  self->request(dispatcher_, std::chrono::seconds(10), dispatcher_unregister_atom::value,
                std::string{"m1"})
      .receive([] {}, [&](caf::error& e) { err = e; });
  EXPECT_FALSE(err) << sys_->render(err);
  std::vector<std::string> roles;
  self->request(dispatcher_, std::chrono::seconds(10), dispatcher_roles_atom::value)
      .receive([&](std::vector<std::string>& r) { roles = r; }, [&](caf::error&) {});
  EXPECT_EQ(roles, std::vector<std::string>{"m2"});
  auto call = client_->call("m1", rank_ops::ping.id, caf::message{});
  ASSERT_FALSE(call);
  EXPECT_TRUE(is(call.error(), errc::not_found)) << error_message(call.error());
  self->request(dispatcher_, std::chrono::seconds(10), dispatcher_unregister_atom::value,
                std::string{"m1"})
      .receive([] { ADD_FAILURE() << "unregistered an unknown role"; },
               [&](caf::error& e) { err = e; });
  EXPECT_TRUE(is(err, errc::not_found));
  EXPECT_NE(error_message(err).find("registered: m2"), std::string::npos) << error_message(err);
  // The group is still alive and serves the remaining role.
  EXPECT_TRUE(client_->call("m2", rank_ops::ping.id, caf::message{}));
}

class WorkerCheckpointArgs : public actor_fixture {};

TEST_F(WorkerCheckpointArgs, OnlyLoadTakesTheWithOptimizerFlag) {
  auto g = ok(spawn_group("w", "policy", 1));
  ok(client_->register_group("policy", g));
  model_spec spec;
  spec.preset = "tiny";
  ok(client_->init_model("policy", spec));
  temp_dir dir("worker_ckpt_args");
  auto root = dir.path().string();
  auto save = client_->call("policy", worker_ops::save_checkpoint.id,
                            caf::make_message(root, int64_t{0}, std::string{"m"}, true));
  ASSERT_FALSE(save);
  EXPECT_NE(error_message(save.error())
                .find("save_checkpoint expects (string root, int64 global_step[, string role])"),
            std::string::npos)
      << error_message(save.error());
  ok(client_->call("policy", worker_ops::save_checkpoint.id,
                   caf::make_message(root, int64_t{0}, std::string{"m"})));
  auto bad = client_->call("policy", worker_ops::load_checkpoint.id,
                           caf::make_message(root, int64_t{0}, std::string{"m"}, int64_t{1}));
  ASSERT_FALSE(bad);
  EXPECT_NE(error_message(bad.error()).find("[, bool with_optimizer]"), std::string::npos)
      << error_message(bad.error());
  auto step = ok(client_->call("policy", worker_ops::load_checkpoint.id,
                               caf::make_message(root, int64_t{0}, std::string{"m"}, false)));
  EXPECT_EQ(step.get_as<int64_t>(0), 0);
}

} // namespace
} // namespace rlforge::actors::test
