// The Tinker backend over the dispatcher: LoRA policies and a critic on one shared base, SFT,
// importance sampling and the ppo → regular mapping, per-loss grouping of a batch, checkpoints
// with and without optimizer state, sampler checkpoints (sync and HF export) matching the
// trainer's log-probs, delete_model freeing the model, the dispatcher's unregister, and bad
// input.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/base_weights.hpp"
#include "actors/dispatcher.hpp"
#include "actors/dispatcher_backend.hpp"
#include "actors/engine.hpp"
#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "actors/worker.hpp"
#include "backends/algo/losses.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "test_support.hpp"

namespace rlforge::actors::test {
namespace {

namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
namespace tk = rlforge::tinker;
namespace fs = std::filesystem;

tk::tensor_data ints(std::vector<int64_t> v) {
  tk::tensor_data t;
  t.type = tk::dtype::int64;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

tk::tensor_data floats(std::vector<double> v) {
  tk::tensor_data t;
  t.type = tk::dtype::float32;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

/// A datum predicting `seq[1:]` from `seq[:-1]` with unit weights.
tk::datum next_tokens(const std::vector<int64_t>& seq) {
  tk::datum d;
  d.tokens.assign(seq.begin(), seq.end() - 1);
  d.loss_fn_inputs["target_tokens"] = ints({seq.begin() + 1, seq.end()});
  d.loss_fn_inputs["weights"] = floats(std::vector<double>(seq.size() - 1, 1.0));
  return d;
}

tk::forward_backward_request request(const std::string& model, std::vector<tk::datum> data,
                                     const std::string& loss = "cross_entropy",
                                     std::map<std::string, double> config = {},
                                     bool forward_only = false) {
  tk::forward_backward_request r;
  r.model_id = model;
  r.data = std::move(data);
  r.loss_fn = loss;
  r.loss_fn_config = std::move(config);
  r.forward_only = forward_only;
  return r;
}

std::vector<tk::datum> sft_data() {
  return {next_tokens({1, 5, 9, 13, 17, 21}), next_tokens({2, 4, 6, 8, 10}),
          next_tokens({3, 30, 300, 3, 30, 300, 3})};
}

tk::lora_config lora(int64_t rank, int64_t seed = 1) {
  tk::lora_config l;
  l.rank = rank;
  l.has_seed = true;
  l.seed = seed;
  return l;
}

/// Runs `f` and expects a request_error of `category` whose message contains `part`.
template <class F> void expect_refused(F f, const std::string& category, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected a " << category << " error containing '" << part << "'";
  } catch (const tk::request_error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    EXPECT_NE(std::string{e.what()}.find(part), std::string::npos) << e.what();
  }
}

class DispatcherBackend : public ::testing::Test {
protected:
  void SetUp() override {
    register_worker_kinds();
    register_engine_kind();
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    base_ = (fs::path(dir_.path()) / "tiny-base").string();
    be::causal_lm::random(be::preset("tiny"), 7)->save_hf(base_);
    dispatcher_backend_options o;
    o.base_model_dir = base_;
    o.timeout = std::chrono::seconds(60);
    backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  }
  void TearDown() override {
    backend_.reset();
    sys_.reset();
  }

  /// Per datum log-probs of a forward pass.
  std::vector<std::vector<double>> logprobs(const std::string& model,
                                            const std::vector<tk::datum>& data) {
    auto out = backend_->forward_backward({request(model, data, "cross_entropy", {}, true)});
    std::vector<std::vector<double>> rows;
    for (auto& m : out.at(0).loss_fn_outputs)
      rows.push_back(m.at("logprobs").floats);
    return rows;
  }

  double sft_step(const std::string& model, double lr = 2e-3) {
    auto out = backend_->forward_backward({request(model, sft_data())});
    tk::adam_params p;
    p.learning_rate = lr;
    backend_->optim_step(model, p);
    return out.at(0).metrics.at("loss:sum");
  }

  std::string path(const std::string& name) const {
    return (fs::path(dir_.path()) / name).string();
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  temp_dir dir_{"tinker_backend"};
  std::string base_;
  std::unique_ptr<dispatcher_backend> backend_;
};

TEST_F(DispatcherBackend, ReportsTheBaseModel) {
  EXPECT_EQ(backend_->base_model_name(), "tiny-base");
  EXPECT_EQ(backend_->vocab_size(), 512);
  EXPECT_EQ(backend_->max_context_length(), 512);
}

TEST_F(DispatcherBackend, LoraModelsShareTheBaseAndTrainIndependently) {
  backend_->create_model("a", lora(4, 1), "policy");
  backend_->create_model("b", lora(4, 2), "policy");
  backend_->create_model("c", lora(4, 3), "critic");
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
  backend_->create_model("p", lora(4), "policy");
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
                  want[0][t].item<double>(), 1e-6) << "datum " << i << " token " << t;
      EXPECT_NEAR(fb.loss_fn_outputs[i].at("elementwise_loss").floats[static_cast<size_t>(t)],
                  want[0][t].item<double>(), 1e-5) << "datum " << i << " token " << t;
    }
    ASSERT_EQ(fb.loss_fn_outputs[i].at("logprobs").floats.size(), current[i].size());
    total += want.sum().item<double>();
  }
  EXPECT_NEAR(fb.metrics.at("loss:sum"), total, 1e-4);
  EXPECT_TRUE(fb.metrics.count("clip_ratio:mean"));
  EXPECT_GT(fb.metrics.at("clip_ratio:mean"), 0.0);
  backend_->optim_step("p", tk::adam_params{});

  // importance_sampling runs and reports its ratio.
  auto is = backend_->forward_backward({request("p", data, "importance_sampling")}).at(0);
  EXPECT_TRUE(is.metrics.count("importance_ratio:mean"));
  auto m = backend_->optim_step("p", tk::adam_params{});
  EXPECT_GT(m.at("grad_norm:mean"), 0.0);
}

TEST_F(DispatcherBackend, CriticTakesOnlyValueLossesAndPolicyNever) {
  backend_->create_model("critic", lora(4), "critic");
  backend_->create_model("policy", lora(4), "policy");
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
  expect_refused([&] { backend_->forward_backward({request("critic", sft_data())}); }, "user",
                 "a critic trains with 'ppo' or 'ppo_critic', not 'cross_entropy'");
  expect_refused([&] { backend_->forward_backward({request("policy", data, "ppo_critic")}); },
                 "user", "ppo_critic");
  expect_refused([&] { backend_->sample("critic", {}); }, "user", "no requests");
  tk::sample_request s;
  s.prompt = {1, 2};
  s.params.max_tokens = 2;
  expect_refused([&] { backend_->sample("critic", {s}); }, "user", "critic");
  expect_refused([&] { backend_->save_sampler_checkpoint("critic", path("cs"), false); }, "user",
                 "critic");
}

TEST_F(DispatcherBackend, ABatchIsSplitPerLossAndOutputsKeepRequestOrder) {
  backend_->create_model("p", lora(4), "policy");
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
                1e-5) << "token " << t;
    wsum -= w[t] * current[0][t];
  }
  EXPECT_NEAR(wout.metrics.at("loss:sum"), wsum, 1e-4);

  backend_->create_model("q", lora(4), "policy");
  expect_refused([&] {
    backend_->forward_backward({request("p", {data[0]}), request("q", {data[0]})});
  }, "user", "one model per batch");
  expect_refused([&] {
    backend_->forward_backward({request("p", {data[0]}), request("p", {data[0]}, "cross_entropy",
                                                                 {}, true)});
  }, "user", "mixes forward");
}

TEST_F(DispatcherBackend, CheckpointsResumeBitForBitWithOptimizerAndLoadWeightsOnly) {
  backend_->create_model("p", lora(4), "policy");
  sft_step("p");
  sft_step("p");
  auto saved_state = logprobs("p", sft_data());
  auto ckpt = path("ckpt");
  backend_->save_checkpoint("p", ckpt, true);
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "tinker_checkpoint.json"));
  sft_step("p");
  sft_step("p");
  auto continued = logprobs("p", sft_data());

  backend_->load_checkpoint("p", ckpt, true);
  EXPECT_EQ(logprobs("p", sft_data()), saved_state);
  sft_step("p");
  sft_step("p");
  EXPECT_EQ(logprobs("p", sft_data()), continued); // bit-identical resume

  // Weights only into another model of the same shape: the weights, a fresh optimizer.
  backend_->create_model("q", lora(4, 9), "policy");
  backend_->load_checkpoint("q", ckpt, false);
  EXPECT_EQ(logprobs("q", sft_data()), saved_state);
  sft_step("q");
  sft_step("q");
  EXPECT_NE(logprobs("q", sft_data()), continued); // fresh moments: another trajectory

  // Saved without optimizer state: only a weights-only load is accepted.
  auto weights_only = path("weights_only");
  backend_->save_checkpoint("q", weights_only, false);
  expect_refused([&] { backend_->load_checkpoint("p", weights_only, true); }, "user",
                 "without optimizer");
  backend_->load_checkpoint("p", weights_only, false);

  backend_->create_model("c", lora(4), "critic");
  backend_->create_model("r8", lora(8), "policy");
  expect_refused([&] { backend_->load_checkpoint("c", ckpt, true); }, "user", "policy with");
  expect_refused([&] { backend_->load_checkpoint("r8", ckpt, true); }, "user", "LoRA rank 4");
  expect_refused([&] { backend_->load_checkpoint("p", path("missing"), true); }, "user",
                 "not a checkpoint");
  expect_refused([&] { backend_->load_checkpoint("nope", ckpt, true); }, "not_found", "nope");
  expect_refused([&] { backend_->save_checkpoint("p", "", true); }, "user", "empty directory");
  // The refusals left p usable and as it was.
  EXPECT_EQ(logprobs("p", sft_data()), logprobs("q", sft_data()));
}

/// Forward log-probs of `prompt + tokens`: (prompt log-probs after position 0, token log-probs).
std::pair<std::vector<double>, std::vector<double>>
split_logprobs(const std::vector<double>& all, size_t prompt) {
  return {{all.begin(), all.begin() + static_cast<long>(prompt - 1)},
          {all.begin() + static_cast<long>(prompt - 1), all.end()}};
}

TEST_F(DispatcherBackend, SamplerCheckpointsSyncOrExportAndMatchTheTrainer) {
  backend_->create_model("p", lora(4), "policy");
  tk::sample_request s;
  s.prompt = {5, 17, 42, 8};
  s.num_samples = 2;
  s.params.max_tokens = 6;
  s.params.has_seed = true;
  s.params.seed = 3;
  s.prompt_logprobs = true;
  // Before any sampler checkpoint the model samples like the base.
  auto base = backend_->sample("", {s}).at(0);
  auto fresh = backend_->sample("p", {s}).at(0);
  ASSERT_EQ(base.sequences.size(), 2u);
  EXPECT_EQ(base.sequences[0].tokens, fresh.sequences[0].tokens);

  for (int i = 0; i < 3; ++i)
    sft_step("p", 1e-2);
  auto check = [&](const tk::sample_response& r) {
    ASSERT_EQ(r.sequences.size(), 2u);
    ASSERT_TRUE(r.has_prompt_logprobs);
    ASSERT_EQ(r.prompt_logprobs.size(), s.prompt.size());
    EXPECT_TRUE(std::isnan(r.prompt_logprobs[0]));
    for (auto& q : r.sequences) {
      ASSERT_FALSE(q.tokens.empty());
      ASSERT_EQ(q.tokens.size(), q.logprobs.size());
      EXPECT_TRUE(q.stop_reason == "length" || q.stop_reason == "stop") << q.stop_reason;
      std::vector<int64_t> seq = s.prompt;
      seq.insert(seq.end(), q.tokens.begin(), q.tokens.end());
      auto lp = logprobs("p", {next_tokens(seq)}).at(0);
      auto [prompt_lp, token_lp] = split_logprobs(lp, s.prompt.size());
      for (size_t t = 0; t < token_lp.size(); ++t)
        EXPECT_NEAR(q.logprobs[t], token_lp[t], 1e-5) << "token " << t;
      for (size_t t = 0; t < prompt_lp.size(); ++t)
        EXPECT_NEAR(r.prompt_logprobs[t + 1], prompt_lp[t], 1e-5) << "prompt token " << t + 1;
    }
  };
  auto marker_dir = path("sampler_sync");
  backend_->save_sampler_checkpoint("p", marker_dir, false);
  EXPECT_TRUE(fs::exists(fs::path(marker_dir) / "sampler_weights.json"));
  EXPECT_FALSE(fs::exists(fs::path(marker_dir) / "model.safetensors"));
  auto synced = backend_->sample("p", {s}).at(0);
  check(synced);
  EXPECT_NE(synced.sequences[0].tokens, base.sequences[0].tokens);

  sft_step("p", 1e-2);
  auto export_dir = path("sampler_export");
  backend_->save_sampler_checkpoint("p", export_dir, true);
  EXPECT_TRUE(fs::exists(fs::path(export_dir) / "config.json"));
  EXPECT_TRUE(fs::exists(fs::path(export_dir) / "model.safetensors"));
  check(backend_->sample("p", {s}).at(0));
  // The base engine still serves the base weights.
  EXPECT_EQ(backend_->sample("", {s}).at(0).sequences[0].tokens, base.sequences[0].tokens);
}

TEST_F(DispatcherBackend, SamplingASamplerCheckpointDirectoryUsesExactlyThoseWeights) {
  dispatcher_backend_options o;
  o.base_model_dir = base_;
  o.max_export_engines = 1;
  o.timeout = std::chrono::seconds(60);
  backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  backend_->create_model("p", lora(4), "policy");
  tk::sample_request s;
  s.prompt = {5, 17, 42, 8};
  s.params.max_tokens = 8;
  s.params.has_seed = true;
  s.params.seed = 11;
  auto tokens = [&](const std::string& from) {
    return backend_->sample(from, {s}).at(0).sequences.at(0).tokens;
  };
  sft_step("p", 1e-2);
  auto v1 = path("v1");
  backend_->save_sampler_checkpoint("p", v1, true);
  auto at_v1 = tokens("p");
  for (int i = 0; i < 3; ++i)
    sft_step("p", 1e-2);
  auto v2 = path("v2");
  backend_->save_sampler_checkpoint("p", v2, true);
  auto at_v2 = tokens("p");
  ASSERT_NE(at_v1, at_v2);
  EXPECT_EQ(tokens(v1), at_v1);
  EXPECT_EQ(tokens(v2), at_v2); // evicts v1's engine (one cached)
  EXPECT_EQ(tokens(v1), at_v1); // reloaded
  // A synced checkpoint directory samples its model's engine.
  auto synced = path("synced");
  sft_step("p", 1e-2);
  backend_->save_sampler_checkpoint("p", synced, false);
  EXPECT_EQ(tokens(synced), tokens("p"));
  // Exports outlive their model; a synced checkpoint does not.
  backend_->delete_model("p");
  EXPECT_EQ(tokens(v2), at_v2);
  expect_refused([&] { tokens(synced); }, "not_found", "was deleted");
  expect_refused([&] { tokens(path("nothing")); }, "not_found", "unknown model or sampler checkpoint");
  fs::create_directories(path("bad"));
  std::ofstream(fs::path(path("bad")) / "sampler_weights.json") << "{\"persist\": 3}";
  expect_refused([&] { tokens(path("bad")); }, "user", "malformed");
}

TEST_F(DispatcherBackend, DeleteModelFreesItsActorsAndTheSharedBase) {
  backend_->create_model("a", lora(4), "policy");
  backend_->create_model("b", lora(4), "policy");
  backend_->save_sampler_checkpoint("a", path("s"), false);
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
  expect_refused([&] { sft_step("a"); }, "not_found", "'a'");
  expect_refused([&] { backend_->delete_model("a"); }, "not_found", "'a'");

  backend_->delete_model("b");
  EXPECT_EQ(shared_base_users(base_), 0);
  EXPECT_EQ(shared_base_bytes(base_), 0);
  // The id can be used again.
  backend_->create_model("a", lora(2), "policy");
  EXPECT_GT(sft_step("a"), 0.0);
}

TEST_F(DispatcherBackend, BadInputIsRefusedNamingItAndTheModelStaysUsable) {
  backend_->create_model("p", lora(4), "policy");
  backend_->create_model("twin", lora(4), "policy"); // same seed: the same initial adapters
  expect_refused([&] { backend_->create_model("p", lora(4), "policy"); }, "user", "already exists");
  expect_refused([&] { backend_->create_model("", lora(4), "policy"); }, "user", "empty");
  expect_refused([&] { backend_->create_model("x", lora(4), "ref"); }, "user", "unknown role");
  expect_refused([&] { backend_->create_model("x", lora(-1), "policy"); }, "user", ">= 0");
  auto none = lora(4);
  none.train_attn = none.train_mlp = false;
  expect_refused([&] { backend_->create_model("x", none, "policy"); }, "user", "adapt nothing");
  EXPECT_FALSE(backend_->has_model("x"));

  expect_refused([&] { backend_->forward_backward({}); }, "user", "empty batch");
  expect_refused([&] { backend_->forward_backward({request("nope", sft_data())}); }, "not_found",
                 "nope");
  expect_refused([&] { backend_->forward_backward({request("p", {})}); }, "user", "no data");
  auto bad = sft_data();
  bad[1].tokens[2] = 512;
  expect_refused([&] { backend_->forward_backward({request("p", bad)}); }, "user",
                 "datum 1: model_input token id 512 at position 2 is outside the vocabulary");
  bad = sft_data();
  bad[2].loss_fn_inputs["target_tokens"].ints.back() = -3;
  expect_refused([&] { backend_->forward_backward({request("p", bad)}); }, "user",
                 "datum 2: target_tokens token id -3");
  expect_refused([&] { backend_->forward_backward({request("p", sft_data(), "nope")}); }, "user",
                 "nope");
  expect_refused([&] {
    backend_->forward_backward({request("p", sft_data(), "cross_entropy", {{"beta", 1}})});
  }, "user", "beta");
  expect_refused([&] {
    backend_->forward_backward({request("p", sft_data(), "ppo", {{"clip_low_threshold", 1.5}})});
  }, "user", "clip_low_threshold");
  // importance_sampling without advantages: refused before any gradient.
  expect_refused([&] {
    backend_->forward_backward({request("p", sft_data(), "cross_entropy"),
                                request("p", sft_data(), "importance_sampling")});
  }, "user", "request 1");

  tk::adam_params neg;
  neg.learning_rate = -1;
  expect_refused([&] { backend_->optim_step("p", neg); }, "user", "learning_rate");
  expect_refused([&] { backend_->optim_step("nope", {}); }, "not_found", "nope");

  tk::sample_request s;
  s.prompt = {1, 2, 3};
  s.params.max_tokens = 4;
  auto with = [&](auto change) {
    auto r = s;
    change(r);
    return std::vector<tk::sample_request>{r};
  };
  expect_refused([&] { backend_->sample("p", with([](auto& r) { r.params.stop_strings = {"x"}; })); },
                 "user", "stop strings");
  expect_refused([&] { backend_->sample("p", with([](auto& r) { r.topk_prompt_logprobs = 2; })); },
                 "user", "topk_prompt_logprobs");
  expect_refused([&] { backend_->sample("p", with([](auto& r) { r.prompt = {1, 600}; })); }, "user",
                 "prompt token id 600");
  expect_refused([&] { backend_->sample("p", with([](auto& r) { r.num_samples = 0; })); }, "user",
                 "num_samples");
  expect_refused([&] { backend_->sample("p", with([](auto& r) { r.params.max_tokens = 0; })); },
                 "user", "max_tokens");
  expect_refused([&] { backend_->sample("p", with([](auto& r) { r.params.top_p = 2; })); }, "user",
                 "top_p");
  expect_refused([&] { backend_->sample("nope", {s}); }, "not_found", "nope");
  expect_refused([&] { backend_->save_sampler_checkpoint("nope", path("x"), true); }, "not_found",
                 "nope");

  // Nothing above changed the model or left gradients behind: one step on p and on its
  // untouched twin gives the same weights.
  EXPECT_EQ(logprobs("p", sft_data()), logprobs("twin", sft_data()));
  EXPECT_EQ(sft_step("p"), sft_step("twin"));
  EXPECT_EQ(logprobs("p", sft_data()), logprobs("twin", sft_data()));
}

TEST_F(DispatcherBackend, OptionsAreChecked) {
  dispatcher_backend_options o;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, "server", "base_model_dir is empty");
  o.base_model_dir = path("missing");
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, "server", "config.json");
  o.base_model_dir = base_;
  o.threads_per_rank = 0;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, "server", "threads_per_rank");
  o.threads_per_rank = 1;
  o.timeout = std::chrono::milliseconds(0);
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, "server", "timeout");
  o.timeout = std::chrono::seconds(5);
  o.max_export_engines = 0;
  expect_refused([&] { dispatcher_backend b(*sys_, o); }, "server", "max_export_engines");
  o.max_export_engines = 4;
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
  expect_refused([&] { broken.create_model("m", lora(2), "policy"); }, "server", "create_model(m)");
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
    b.create_model("a", lora(2), "policy");
    b.create_model("b", lora(2), "policy");
    // The GPU is taken by a and b: a third model does not fit, and nothing of it stays behind.
    expect_refused([&] { b.create_model("c", lora(2), "policy"); }, "server", "GPU 0.5");
    EXPECT_FALSE(b.has_model("c"));
    b.delete_model("a");
    b.create_model("c", lora(2), "policy"); // a's share is back
    EXPECT_TRUE(b.has_model("c"));
  }
  caf::anon_send_exit(mgr, caf::exit_reason::user_shutdown);
}

TEST_F(DispatcherBackend, ModelsTrainConcurrentlyWithoutDisturbingEachOther) {
  backend_->create_model("a", lora(4, 1), "policy");
  backend_->create_model("b", lora(4, 2), "critic");
  backend_->create_model("a_alone", lora(4, 1), "policy");
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
  at::NoGradGuard no_grad;
  auto ids = at::tensor(std::vector<int64_t>{1, 2, 3, 4}).view({1, 4});
  EXPECT_TRUE(at::equal(b->logits(b->forward_hidden(ids)),
                        fresh->logits(fresh->forward_hidden(ids))));
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
  auto call = client_->call("m1", "ping", caf::message{});
  ASSERT_FALSE(call);
  EXPECT_TRUE(is(call.error(), errc::not_found)) << error_message(call.error());
  self->request(dispatcher_, std::chrono::seconds(10), dispatcher_unregister_atom::value,
                std::string{"m1"})
    .receive([] { ADD_FAILURE() << "unregistered an unknown role"; },
             [&](caf::error& e) { err = e; });
  EXPECT_TRUE(is(err, errc::not_found));
  EXPECT_NE(error_message(err).find("registered: m2"), std::string::npos) << error_message(err);
  // The group is still alive and serves the remaining role.
  EXPECT_TRUE(client_->call("m2", "ping", caf::message{}));
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
  auto save = client_->call("policy", "save_checkpoint",
                            caf::make_message(root, int64_t{0}, std::string{"m"}, true));
  ASSERT_FALSE(save);
  EXPECT_NE(error_message(save.error())
              .find("save_checkpoint expects (string root, int64 global_step[, string role])"),
            std::string::npos)
    << error_message(save.error());
  ok(client_->call("policy", "save_checkpoint", caf::make_message(root, int64_t{0},
                                                                  std::string{"m"})));
  auto bad = client_->call("policy", "load_checkpoint",
                           caf::make_message(root, int64_t{0}, std::string{"m"}, int64_t{1}));
  ASSERT_FALSE(bad);
  EXPECT_NE(error_message(bad.error()).find("[, bool with_optimizer]"), std::string::npos)
    << error_message(bad.error());
  auto step = ok(client_->call("policy", "load_checkpoint",
                               caf::make_message(root, int64_t{0}, std::string{"m"}, false)));
  EXPECT_EQ(step.get_as<int64_t>(0), 0);
}

} // namespace
} // namespace rlforge::actors::test
