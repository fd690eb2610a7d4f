// The dispatcher: data-parallel gradient semantics (one rank on a batch = two ranks on its
// halves), padding and order of per-row outputs, metric reductions over ranks, roles added at
// run time, deadlines, checkpoints (bit-identical resume, world-size check), and the payload
// row operations against the backends' batch functions.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/actor_kind.hpp"
#include "actors/batch_wire.hpp"
#include "actors/dispatcher.hpp"
#include "actors/tensor_convert.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/checkpoint.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "test_support.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;
namespace fs = std::filesystem;

namespace {

using test::max_abs_diff;

/// A batch with PPO inputs; old log-probs near the tiny model's (r ≈ 1, away from the clip
/// edges) and advantages of both signs.
be::training_batch make_batch(int64_t rows, uint64_t seed) {
  std::vector<std::vector<int64_t>> prompts, responses;
  be::per_token_values per_token;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int64_t i = 0; i < rows; ++i) {
    auto p = at::randint(1, 500, {2 + (i * 7 + static_cast<int64_t>(seed)) % 4}, gen, at::kLong);
    auto r = at::randint(1, 500, {1 + (i * 5 + static_cast<int64_t>(seed)) % 5}, gen, at::kLong);
    prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    responses.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
    std::vector<float> adv, old;
    for (int64_t t = 0; t < r.numel(); ++t) {
      adv.push_back(static_cast<float>((i % 3 == 0 ? -1.0 : 0.7) + 0.05 * t));
      old.push_back(static_cast<float>(-6.24 + 0.003 * t));
    }
    per_token["advantages"].push_back(adv);
    per_token["action_log_probs"].push_back(old);
  }
  return be::from_sequences(prompts, responses, per_token);
}

model_spec tiny_spec(uint64_t seed) {
  model_spec s;
  s.compute_dtype = "fp32"; // these tests compare fp32 numerics to 1e-5 or tighter
  s.preset = "tiny";
  s.seed = seed;
  s.lr_schedule = "cosine";
  s.learning_rate = 1e-2;
  s.warmup_steps = 1;
  s.total_steps = 12;
  s.min_lr_ratio = 0.1;
  return s;
}

using test::temp_dir;

/// The sleeper kind's one op: rank 1 sleeps `ms`, the others answer at once.
constexpr op_ref<caf::message(int32_t)> sleep_op{"sleep", caf::atom("sleep")};

void register_sleeper_kind() {
  actor_kind k;
  k.name = "test.sleeper";
  k.implements<rank_interface<sleep_op>>();
  k.add(context_op(
      sleep_op, +[](rank_context& ctx, const int32_t& ms) -> caf::expected<caf::message> {
        if (ctx.info.rank == 1)
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return caf::message{};
      }));
  register_kind(std::move(k));
}

class Dispatcher : public test::actor_fixture {
protected:
  void register_kinds() override {
    register_worker_kinds();
    register_sleeper_kind();
  }

  actor_group spawn(const std::string& name, const std::string& kind, int ranks) {
    auto g = spawn_group(name, kind, ranks);
    EXPECT_TRUE(g) << sys_->render(g.error());
    if (!g)
      throw std::runtime_error("spawn failed");
    return *g;
  }

  /// Spawns, registers and initialises a worker group.
  actor_group add_role(const std::string& role, const std::string& kind, int ranks,
                       const model_spec& spec) {
    auto g = spawn(role, kind, ranks);
    auto n = client_->register_group(role, g);
    EXPECT_TRUE(n) << sys_->render(n.error());
    auto p = client_->init_model(role, spec);
    EXPECT_TRUE(p) << sys_->render(p.error());
    return g;
  }

  using actor_fixture::ok;

  void ok(caf::expected<void> x) {
    EXPECT_TRUE(x) << sys_->render(x.error());
    if (!x)
      throw std::runtime_error("call failed");
  }

  /// Weights of `role` (rank 0) as written by its HF export.
  std::map<std::string, at::Tensor> weights(const std::string& role, const temp_dir& dir) {
    auto path = dir.str() + "/" + role;
    ok(client_->save_hf_model(role, path));
    return be::causal_lm::load(path)->state_dict();
  }
};

/// See worker_test.cpp: eps = 1 makes AdamW's first update lr·g/(|g|+1), so weight
/// differences measure gradient differences instead of amplifying rounding near zero.
rlforge::tinker::adam_params linear_adam(double lr) {
  rlforge::tinker::adam_params r;
  r.learning_rate = lr;
  r.eps = 1.0;
  r.grad_clip_norm = 100.0;
  return r;
}

} // namespace

TEST_F(Dispatcher, OneRankOnABatchEqualsTwoRanksOnItsHalves) {
  add_role("single", "policy", 1, tiny_spec(11));
  add_role("pair", "policy", 2, tiny_spec(11));
  auto batch = make_batch(6, 1);
  auto a = ok(client_->forward_backward("single", batch, "regular"));
  auto b = ok(client_->forward_backward("pair", batch, "regular"));
  // loss:sum adds over ranks; per-row outputs come back in input order.
  EXPECT_NEAR(a.metric("loss:sum"), b.metric("loss:sum"), 1e-5 * std::abs(a.metric("loss:sum")));
  EXPECT_NEAR(a.metric("clip_ratio:mean"), b.metric("clip_ratio:mean"), 1e-9);
  EXPECT_NEAR(a.metric("entropy:mean"), b.metric("entropy:mean"), 1e-5);
  for (auto key : {"logprobs", "elementwise_loss", "entropy"}) {
    ASSERT_EQ(b.outputs.at(key).sizes(), a.outputs.at(key).sizes()) << key;
    EXPECT_LT(max_abs_diff(a.outputs.at(key), b.outputs.at(key)), 1e-5) << key;
  }
  auto sa = ok(client_->optim_step("single", linear_adam(1e-2)));
  auto sb = ok(client_->optim_step("pair", linear_adam(1e-2)));
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-6 * sa.grad_norm);
  temp_dir dir;
  auto wa = weights("single", dir);
  auto wb = weights("pair", dir);
  auto w0 = be::causal_lm::random(be::preset("tiny"), 11)->state_dict();
  double moved = 0;
  for (auto& [name, t] : wa) {
    EXPECT_LT(max_abs_diff(t, wb.at(name)), 1e-6) << name;
    moved = std::max(moved, max_abs_diff(t, w0.at(name)));
  }
  EXPECT_GT(moved, 1e-3);
  // Rank 1 holds the same weights as rank 0: its forward on the same rows agrees.
  auto two_rows = be::slice_rows(batch, 0, 2);
  auto fa = ok(client_->forward("single", two_rows));
  auto fb = ok(client_->forward("pair", two_rows)); // row 0 on rank 0, row 1 on rank 1
  EXPECT_LT(max_abs_diff(fa.outputs.at("logprobs"), fb.outputs.at("logprobs")), 1e-5);
}

TEST_F(Dispatcher, PadsToTheDpSizeAndDropsThePaddingRows) {
  add_role("single", "policy", 1, tiny_spec(12));
  add_role("triple", "policy", 3, tiny_spec(12));
  EXPECT_EQ(ok(client_->lcm_dp_size()), 3);
  auto batch = make_batch(5, 2); // 5 rows over 3 ranks: one padding row
  auto a = ok(client_->forward_backward("single", batch, "regular"));
  auto b = ok(client_->forward_backward("triple", batch, "regular"));
  ASSERT_EQ(b.outputs.at("logprobs").size(0), 5);
  EXPECT_LT(max_abs_diff(a.outputs.at("logprobs"), b.outputs.at("logprobs")), 1e-5);
  EXPECT_LT(max_abs_diff(a.outputs.at("elementwise_loss"), b.outputs.at("elementwise_loss")), 1e-5);
  // The padding row has loss_mask 0: it adds nothing to the loss or the gradient.
  EXPECT_NEAR(a.metric("loss:sum"), b.metric("loss:sum"), 1e-5 * std::abs(a.metric("loss:sum")));
  auto sa = ok(client_->optim_step("single", linear_adam(1e-2)));
  auto sb = ok(client_->optim_step("triple", linear_adam(1e-2)));
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-6 * sa.grad_norm);
}

TEST_F(Dispatcher, MeanMetricsAreWeightedByEachRanksTokens) {
  add_role("pair", "policy", 2, tiny_spec(13));
  auto batch = make_batch(4, 3);
  auto fwd = ok(client_->forward("pair", batch));
  const auto& entropy = fwd.outputs.at("entropy");
  auto mask = batch.get("loss_mask");
  double want = (entropy * mask).sum().item<double>() / mask.sum().item<double>();
  EXPECT_NEAR(fwd.metric("entropy:mean"), want, 1e-5);
  // The reductions themselves.
  auto m = combine_metrics({{{{"loss:sum", 1.0}, {"x:mean", 2.0}, {"y:max", 3.0}, {"z:min", 4.0}},
                             1.0},
                            {{{"loss:sum", 2.5}, {"x:mean", 5.0}, {"y:max", 1.0}, {"z:min", -1.0}},
                             3.0}});
  EXPECT_DOUBLE_EQ(m.at("loss:sum"), 3.5);
  EXPECT_DOUBLE_EQ(m.at("x:mean"), (2.0 * 1 + 5.0 * 3) / 4);
  EXPECT_DOUBLE_EQ(m.at("y:max"), 3.0);
  EXPECT_DOUBLE_EQ(m.at("z:min"), -1.0);
  auto unweighted = combine_metrics({{{{"x:mean", 2.0}}, 0.0}, {{{"x:mean", 4.0}}, 0.0}});
  EXPECT_DOUBLE_EQ(unweighted.at("x:mean"), 3.0);
}

TEST_F(Dispatcher, ACriticCanBeAddedAtRunTimeAndUnknownRolesAreNamed) {
  add_role("policy", "policy", 1, tiny_spec(14));
  auto batch = make_batch(3, 4);
  auto missing = client_->forward("critic", batch);
  ASSERT_FALSE(missing);
  EXPECT_TRUE(is(missing.error(), errc::not_found));
  auto text = sys_->render(missing.error());
  EXPECT_NE(text.find("'critic'"), std::string::npos) << text;
  EXPECT_NE(text.find("registered: policy"), std::string::npos) << text;
  ok(client_->forward_backward("policy", batch, "cross_entropy"));
  add_role("critic", "critic", 2, tiny_spec(14));
  EXPECT_EQ(ok(client_->lcm_dp_size()), 2);
  auto values = ok(client_->forward("critic", batch));
  EXPECT_EQ(values.outputs.at("values").sizes(), batch.get("loss_mask").sizes());
  auto step = ok(client_->optim_step("policy", linear_adam(1e-3)));
  EXPECT_FALSE(step.skipped);
}

TEST_F(Dispatcher, CallsHaveDeadlinesThatNameRoleRankAndOp) {
  auto g = spawn("sleepers", "test.sleeper", 2);
  ok(client_->register_group("sleepers", g));
  trainer_client impatient{*sys_, dispatcher_, 200ms};
  auto r = impatient.call("sleepers", sleep_op.id, caf::make_message(int32_t{1500}));
  ASSERT_FALSE(r);
  EXPECT_TRUE(is(r.error(), errc::timeout)) << sys_->render(r.error());
  auto text = sys_->render(r.error());
  for (auto frag : {"role 'sleepers'", "rank 1", "'sleep'"})
    EXPECT_NE(text.find(frag), std::string::npos) << frag << " not in: " << text;
  std::this_thread::sleep_for(1500ms); // let rank 1 finish its sleep
  EXPECT_TRUE(client_->call("sleepers", sleep_op.id, caf::make_message(int32_t{1})));
  // A non-positive deadline is refused.
  caf::scoped_actor self{*sys_};
  bool refused = false;
  self->request(dispatcher_, 5s, dispatcher_call_atom::value, std::string{"sleepers"}, sleep_op.id,
                caf::make_message(int32_t{1}), int64_t{0})
      .receive([](op_result&) {}, [&](caf::error& e) { refused = is(e, errc::invalid_argument); });
  EXPECT_TRUE(refused);
}

// A call by an id the role's kind does not have, or with argument types its op does not take,
// is refused naming the role, the op and what it takes; the role keeps serving.
TEST_F(Dispatcher, AnUnknownOpIdOrWrongArgumentTypesAreRefusedNamingTheOp) {
  auto g = spawn("sleepers", "test.sleeper", 2);
  ok(client_->register_group("sleepers", g));
  auto unknown = client_->call("sleepers", caf::atom("nope"), caf::message{});
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(is(unknown.error(), errc::not_found)) << sys_->render(unknown.error());
  auto text = sys_->render(unknown.error());
  for (auto frag : {"role 'sleepers'", "kind 'test.sleeper' has no such op 'nope'", "sleep"})
    EXPECT_NE(text.find(frag), std::string::npos) << frag << " not in: " << text;
  auto wrong = client_->call("sleepers", sleep_op.id, caf::make_message(std::string{"1"}));
  ASSERT_FALSE(wrong);
  EXPECT_TRUE(is(wrong.error(), errc::invalid_argument)) << sys_->render(wrong.error());
  text = sys_->render(wrong.error());
  EXPECT_NE(text.find("sleep expects (int32)"), std::string::npos) << text;
  EXPECT_TRUE(client_->call("sleepers", sleep_op.id, caf::make_message(int32_t{1})));
}

TEST_F(Dispatcher, ResumeFromACheckpointIsBitIdentical) {
  add_role("policy", "policy", 2, tiny_spec(15));
  std::vector<be::training_batch> batches{make_batch(4, 5), make_batch(4, 6), make_batch(4, 7)};
  auto train = [&](int steps, int offset) {
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) {
      const auto& b = batches[(offset + i) % batches.size()];
      losses.push_back(ok(client_->forward_backward("policy", b, "regular")).metric("loss:sum"));
      rlforge::tinker::adam_params r;
      r.learning_rate = -1; // the cosine schedule
      r.weight_decay = 0.01;
      r.grad_clip_norm = 1.0;
      losses.push_back(ok(client_->optim_step("policy", r)).grad_norm);
    }
    return losses;
  };
  temp_dir dir;
  train(3, 0);
  ok(client_->save_checkpoint(dir.str(), 3, {"policy"}, nlohmann::json{{"epoch", 1}}));
  auto expected = train(3, 3);
  // Disturb the state, then resume from the latest committed step.
  train(2, 1);
  EXPECT_EQ(ok(client_->load_checkpoint(dir.str(), -1, {"policy"})), 3);
  auto resumed = train(3, 3);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(resumed[i], expected[i]) << "entry " << i;
  EXPECT_TRUE(fs::exists(dir.str() + "/global_step_3/policy/rank_1/meta.json"));
  EXPECT_EQ(be::read_trainer_state(dir.str(), 3).at("epoch"), 1);
}

TEST_F(Dispatcher, ACheckpointOfAnotherWorldSizeIsRefused) {
  temp_dir dir;
  {
    auto g = add_role("policy", "policy", 2, tiny_spec(16));
    ok(client_->save_checkpoint(dir.str(), 1, {"policy"}));
    g.stop();
  }
  add_role("policy", "policy", 1, tiny_spec(17)); // replaces the role
  auto batch = make_batch(2, 8);
  auto before = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  auto r = client_->load_checkpoint(dir.str(), 1, {"policy"});
  ASSERT_FALSE(r);
  auto text = sys_->render(r.error());
  EXPECT_TRUE(is(r.error(), errc::invalid_argument)) << text;
  EXPECT_NE(text.find("world size 2"), std::string::npos) << text;
  // Nothing was loaded; the worker keeps training.
  auto after = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  EXPECT_TRUE(at::equal(before, after));
  ok(client_->forward_backward("policy", batch, "regular"));
  EXPECT_FALSE(ok(client_->optim_step("policy", linear_adam(1e-3))).skipped);
  auto none = client_->load_checkpoint(dir.str() + "/nothing", -1, {"policy"});
  ASSERT_FALSE(none);
  EXPECT_TRUE(is(none.error(), errc::not_found)) << sys_->render(none.error());
}

TEST(BatchWire, PayloadRowOperationsMatchTheBackends) {
  auto batch = make_batch(5, 9);
  auto payload = to_payload(batch);
  ASSERT_TRUE(payload);
  for (int64_t n : {1, 2, 3, 4, 7}) {
    auto padded = pad_payload(*payload, n);
    ASSERT_TRUE(padded);
    auto want = be::pad_to_multiple(batch, n);
    auto got = from_payload(*padded);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->pad_size, want.pad_size);
    EXPECT_EQ(got->uids, want.uids);
    for (auto& [name, t] : want.tensors)
      EXPECT_TRUE(at::equal(got->tensors.at(name), t)) << name << " n=" << n;
    auto shards = shard_payload(*padded, n);
    ASSERT_TRUE(shards);
    auto want_shards = be::shard(want, n);
    ASSERT_EQ(shards->size(), want_shards.size());
    for (size_t i = 0; i < want_shards.size(); ++i) {
      auto s = from_payload((*shards)[i]);
      ASSERT_TRUE(s);
      EXPECT_EQ(s->pad_size, want_shards[i].pad_size) << "shard " << i;
      for (auto& [name, t] : want_shards[i].tensors)
        EXPECT_TRUE(at::equal(s->tensors.at(name), t)) << name << " shard " << i;
    }
  }
  // Bad input names the problem.
  EXPECT_FALSE(pad_payload(*payload, 0));
  EXPECT_FALSE(shard_payload(*payload, 2)); // 5 rows
  EXPECT_FALSE(pad_payload(batch_payload{}, 2));
  auto uneven = *payload;
  uneven.tensors["advantages"].shape[0] = 4;
  uneven.tensors["advantages"].bytes.resize(uneven.tensors["advantages"].bytes.size() / 5 * 4);
  auto rows = payload_rows(uneven);
  ASSERT_FALSE(rows);
  EXPECT_NE(error_message(rows.error()).find("'advantages' has 4 rows"), std::string::npos)
    << error_message(rows.error());
  auto bad_ids = *payload;
  bad_ids.uids = {1, 2};
  EXPECT_FALSE(payload_rows(bad_ids));
  // merge_results: outputs concatenated in order, the last pad rows dropped.
  batch_result r0, r1;
  r0.outputs["x"] = *to_blob(at::arange(6, at::kFloat).reshape({2, 3}));
  r1.outputs["x"] = *to_blob(at::arange(6, 12, at::kFloat).reshape({2, 3}));
  r0.metrics = {{"loss:sum", 1.0}};
  r1.metrics = {{"loss:sum", 2.0}};
  auto merged = merge_results({r0, r1}, 1);
  ASSERT_TRUE(merged);
  auto x = from_blob(merged->outputs.at("x"));
  ASSERT_TRUE(x);
  EXPECT_TRUE(at::equal(*x, at::arange(9, at::kFloat).reshape({3, 3})));
  EXPECT_DOUBLE_EQ(merged->metrics.at("loss:sum"), 3.0);
  r1.outputs["x"] = *to_blob(at::zeros({2, 4}));
  EXPECT_FALSE(merge_results({r0, r1}, 0));
  EXPECT_FALSE(merge_results({r0, r0}, 5));
}
