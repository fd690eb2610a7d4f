// Offload and onload of the policy, critic and ref workers' model and optimizer state on a real
// actor system, calling the groups directly (no dispatcher, which onloads by itself): resident and
// host byte counts against closed forms, bit-identical round trips of parameters, accumulated
// gradients and AdamW state (against a control group that never offloads), refusal of every
// compute op while offloaded, bad tags, LoRA, two data-parallel ranks, and `worker_model`.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/actor_kind.hpp"
#include "actors/batch_wire.hpp"
#include "actors/worker.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/checkpoint.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "test_support.hpp"

using namespace rlforge;
using namespace rlforge::actors;
namespace be = rlforge::backends;

namespace {

using tags = std::vector<std::string>;
constexpr std::chrono::seconds call_timeout{60};

/// `rows` rows with prompts of 3 + i % 3 tokens and responses of 2 + i % 4, with RL inputs.
be::training_batch make_batch(int64_t rows, uint64_t seed) {
  std::vector<std::vector<int64_t>> prompts, responses;
  be::per_token_values per_token;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int64_t i = 0; i < rows; ++i) {
    auto p = at::randint(1, 500, {3 + i % 3}, gen, at::kLong);
    auto r = at::randint(1, 500, {2 + i % 4}, gen, at::kLong);
    prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    responses.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
    std::vector<float> adv, old, ret, val;
    for (size_t t = 0; t < responses.back().size(); ++t) {
      adv.push_back(static_cast<float>((i % 2 ? 1.0 : -0.5) * (1.0 + 0.1 * t)));
      old.push_back(static_cast<float>(-6.24 - 0.002 * t));
      ret.push_back(static_cast<float>(0.3 * i - 0.1 * t));
      val.push_back(static_cast<float>(0.01 * t));
    }
    per_token["advantages"].push_back(adv);
    per_token["action_log_probs"].push_back(old);
    per_token["returns"].push_back(ret);
    per_token["values"].push_back(val);
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

rlforge::tinker::adam_params adam(double lr) {
  rlforge::tinker::adam_params r;
  r.learning_rate = lr;
  r.weight_decay = 0.01;
  return r;
}

struct memory_use {
  int64_t resident = 0;
  int64_t host = 0;
};

class WorkerOffload : public test::actor_fixture {
protected:
  /// Spawns `ranks` ranks of `kind` as group `name` and initialises their models.
  actor_group start(const std::string& name, const std::string& kind, int ranks,
                    const model_spec& spec) {
    auto g = ok(spawn_group(name, kind, ranks));
    auto counts = ok(g.call_all(worker_ops::init_model.id, caf::make_message(spec), call_timeout));
    num_params_ = counts.at(0).get_as<int64_t>(0);
    return g;
  }

  /// `op(args)` on every rank; the first error, or nothing.
  caf::error run(actor_group& g, caf::atom_value op, caf::message args) {
    auto r = g.call_all(op, args, call_timeout);
    return r ? caf::error{} : std::move(r.error());
  }

  void expect_ok(const caf::error& err) {
    EXPECT_FALSE(err) << sys_->render(err);
  }

  /// Expects an `invalid_argument` error whose text holds every fragment.
  void expect_refused(const caf::error& err, const std::vector<std::string>& fragments) {
    ASSERT_TRUE(err) << "expected an error";
    EXPECT_TRUE(is(err, errc::invalid_argument)) << sys_->render(err);
    auto text = sys_->render(err);
    for (const auto& f : fragments)
      EXPECT_NE(text.find(f), std::string::npos) << "'" << f << "' not in: " << text;
  }

  void offload(actor_group& g, const tags& t) {
    expect_ok(run(g, worker_ops::offload.id, caf::make_message(t)));
  }

  void onload(actor_group& g, const tags& t) {
    expect_ok(run(g, worker_ops::onload.id, caf::make_message(t)));
  }

  /// Every rank's resident and host bytes, in rank order.
  std::vector<memory_use> memory(actor_group& g) {
    std::vector<memory_use> out;
    for (auto& m : ok(g.call_all(worker_ops::memory.id, caf::make_message(), call_timeout))) {
      EXPECT_TRUE((m.match_elements<int64_t, int64_t>())) << caf::to_string(m);
      out.push_back({m.get_as<int64_t>(0), m.get_as<int64_t>(1)});
    }
    return out;
  }

  /// `op` with rank i getting the i-th of equal row shards of `batch` (plus `loss`); the
  /// merged outputs in row order.
  caf::expected<std::map<std::string, at::Tensor>>
  batch_call(actor_group& g, caf::atom_value op, const be::training_batch& batch,
             std::optional<loss_request> loss = std::nullopt) {
    auto ranks = static_cast<int64_t>(ok(g.ranks()).size());
    auto shards = ok(shard_payload(ok(to_payload(batch)), ranks));
    std::vector<caf::message> chunks;
    for (auto& s : shards)
      chunks.push_back(loss ? caf::make_message(std::move(s), *loss)
                            : caf::make_message(std::move(s)));
    auto answers = g.call_mesh(op, std::move(chunks), call_timeout);
    if (!answers)
      return std::move(answers.error());
    std::vector<batch_result> parts;
    for (auto& a : *answers)
      parts.push_back(a.get_as<batch_result>(0));
    return from_blobs(ok(merge_results(parts, 0)).outputs);
  }

  at::Tensor logprobs(actor_group& g, const be::training_batch& batch) {
    return ok(batch_call(g, worker_ops::forward.id, batch)).at("logprobs");
  }

  void forward_backward(actor_group& g, const be::training_batch& batch) {
    ok(batch_call(g, worker_ops::forward_backward.id, batch, loss_request{"regular", {}, {}}));
  }

  void step(actor_group& g) {
    auto r = ok(g.call_all(worker_ops::optim_step.id, caf::make_message(adam(1e-2)), call_timeout));
    EXPECT_FALSE(r.at(0).get_as<optim_result>(0).skipped);
  }

  /// Saves every rank of `g` under `dir.str()` (role = group name) and reads the states back.
  std::vector<be::rank_checkpoint> snapshot(actor_group& g, const std::string& name,
                                            const test::temp_dir& dir) {
    expect_ok(
        run(g, worker_ops::save_checkpoint.id, caf::make_message(dir.str(), int64_t{1}, name)));
    auto ranks = ok(g.ranks());
    std::vector<be::rank_checkpoint> out;
    for (auto& r : ranks)
      out.push_back(be::load_rank_state(
        be::checkpoint_location{dir.str(), 1, name, r.rank, r.world_size}));
    return out;
  }

  /// Parameters, optimizer moments and step counts of two snapshots are bit-identical.
  void expect_identical(const std::vector<be::rank_checkpoint>& a,
                        const std::vector<be::rank_checkpoint>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t r = 0; r < a.size(); ++r) {
      ASSERT_EQ(a[r].model.size(), b[r].model.size());
      for (const auto& [name, t] : a[r].model)
        EXPECT_TRUE(at::equal(t, b[r].model.at(name))) << "rank " << r << " " << name;
      ASSERT_EQ(a[r].optimizer.params.size(), b[r].optimizer.params.size());
      for (const auto& [name, s] : a[r].optimizer.params) {
        const auto& o = b[r].optimizer.params.at(name);
        EXPECT_EQ(s.step, o.step) << name;
        EXPECT_TRUE(at::equal(s.exp_avg, o.exp_avg)) << name;
        EXPECT_TRUE(at::equal(s.exp_avg_sq, o.exp_avg_sq)) << name;
      }
    }
  }

  int64_t num_params_ = 0;
};

TEST_F(WorkerOffload, MemoryLeavesTheDeviceAndComesBack) {
  auto g = start("policy", "policy", 1, tiny_spec(1));
  const int64_t p = 4 * num_params_; // fp32 bytes of the parameters
  EXPECT_EQ(memory(g).at(0).resident, p);
  auto batch = make_batch(4, 1);
  forward_backward(g, batch);
  step(g);
  forward_backward(g, batch); // gradients accumulated again
  // Parameters, gradients and the two AdamW moments.
  auto m = memory(g).at(0);
  EXPECT_EQ(m.resident, 4 * p);
  EXPECT_EQ(m.host, 0);
  offload(g, {"model"});
  m = memory(g).at(0);
  EXPECT_EQ(m.resident, 2 * p); // the moments stay
  EXPECT_EQ(m.host, 2 * p);
  offload(g, {});
  m = memory(g).at(0);
  EXPECT_EQ(m.resident, 0);
  EXPECT_EQ(m.host, 4 * p);
  offload(g, {"optimizer", "model"}); // already offloaded: nothing happens
  m = memory(g).at(0);
  EXPECT_EQ(m.resident, 0);
  EXPECT_EQ(m.host, 4 * p);
  onload(g, {"optimizer"});
  m = memory(g).at(0);
  EXPECT_EQ(m.resident, 2 * p);
  EXPECT_EQ(m.host, 2 * p);
  onload(g, {});
  onload(g, {"model"}); // already resident: nothing happens
  m = memory(g).at(0);
  EXPECT_EQ(m.resident, 4 * p);
  EXPECT_EQ(m.host, 0);
}

TEST_F(WorkerOffload, RefAndCriticOffloadTheirModels) {
  auto ref = start("ref", "ref", 1, tiny_spec(2));
  const int64_t p = 4 * num_params_;
  offload(ref, {});
  auto m = memory(ref).at(0);
  EXPECT_EQ(m.resident, 0);
  EXPECT_EQ(m.host, p);
  onload(ref, {"model"});
  EXPECT_EQ(memory(ref).at(0).resident, p);

  auto critic = start("critic", "critic", 1, tiny_spec(2));
  auto batch = make_batch(4, 2);
  auto before = ok(batch_call(critic, worker_ops::forward.id, batch)).at("values");
  ok(batch_call(critic, worker_ops::forward_backward.id, batch,
                loss_request{"ppo_critic", {}, {}}));
  offload(critic, {});
  EXPECT_EQ(memory(critic).at(0).resident, 0);
  onload(critic, {});
  EXPECT_TRUE(
      at::equal(ok(batch_call(critic, worker_ops::forward.id, batch)).at("values"), before));
  step(critic);
}

TEST_F(WorkerOffload, ParametersRoundTripBitForBit) {
  auto spec = tiny_spec(3);
  auto g = start("a", "policy", 1, spec);
  auto control = start("b", "policy", 1, spec);
  auto batch = make_batch(4, 3);
  forward_backward(g, batch);
  forward_backward(control, batch);
  step(g);
  step(control);
  auto before = logprobs(g, batch);
  offload(g, {"model"});
  onload(g, {"model"});
  EXPECT_TRUE(at::equal(logprobs(g, batch), before));
  test::temp_dir dir("offload");
  expect_ok(run(g, worker_ops::save_hf_model.id, caf::make_message(dir.str() + "/a")));
  expect_ok(run(control, worker_ops::save_hf_model.id, caf::make_message(dir.str() + "/b")));
  auto a = be::causal_lm::load(dir.str() + "/a")->state_dict();
  auto b = be::causal_lm::load(dir.str() + "/b")->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a)
    EXPECT_TRUE(at::equal(t, b.at(name))) << name;
}

TEST_F(WorkerOffload, AccumulatedGradientsSurviveARoundTrip) {
  auto spec = tiny_spec(4);
  auto g = start("a", "policy", 1, spec);
  auto control = start("b", "policy", 1, spec);
  auto first = make_batch(4, 4), second = make_batch(3, 5);
  forward_backward(g, first);
  forward_backward(control, first);
  offload(g, {"model"});
  onload(g, {"model"});
  // Accumulation continues on the onloaded gradients.
  forward_backward(g, second);
  forward_backward(control, second);
  offload(g, {});
  onload(g, {});
  step(g);
  step(control);
  EXPECT_TRUE(at::equal(logprobs(g, first), logprobs(control, first)));
  test::temp_dir dir("offload");
  expect_identical(snapshot(g, "a", dir), snapshot(control, "b", dir));
}

TEST_F(WorkerOffload, OptimizerStateSurvivesARoundTrip) {
  auto spec = tiny_spec(5);
  auto g = start("a", "policy", 1, spec);
  auto control = start("b", "policy", 1, spec);
  auto batch = make_batch(4, 6);
  for (int i = 0; i < 2; ++i) {
    forward_backward(g, batch);
    forward_backward(control, batch);
    step(g);
    step(control);
    if (i == 0) {
      offload(g, {"optimizer"});
      offload(g, {"model"});
      onload(g, {"optimizer", "model"});
    }
  }
  EXPECT_TRUE(at::equal(logprobs(g, batch), logprobs(control, batch)));
  test::temp_dir dir("offload");
  auto a = snapshot(g, "a", dir);
  expect_identical(a, snapshot(control, "b", dir));
  EXPECT_EQ(a.at(0).optimizer.params.begin()->second.step, 2);
}

TEST_F(WorkerOffload, ComputeOpsAreRefusedWhileOffloadedAndWorkAfterOnload) {
  auto spec = tiny_spec(6);
  auto g = start("policy", "policy", 1, spec);
  auto control = start("control", "policy", 1, spec);
  auto batch = make_batch(4, 7);
  forward_backward(g, batch);
  forward_backward(control, batch);
  test::temp_dir dir("offload");
  expect_ok(run(g, worker_ops::save_checkpoint.id, caf::make_message(dir.str(), int64_t{0})));
  offload(g, {"model"});
  const std::vector<std::string> why{"policy worker", "needs the model on the device",
                                     "offloaded", "call onload"};
  auto with = [&](std::vector<std::string> f, const std::string& op) {
    f.push_back(op);
    return f;
  };
  auto fwd = batch_call(g, worker_ops::forward.id, batch);
  ASSERT_FALSE(fwd);
  expect_refused(fwd.error(), with(why, "forward"));
  auto fb = batch_call(g, worker_ops::forward_backward.id, batch, loss_request{"regular", {}, {}});
  ASSERT_FALSE(fb);
  expect_refused(fb.error(), with(why, "forward_backward"));
  expect_refused(run(g, worker_ops::optim_step.id, caf::make_message(adam(1e-2))),
                 with(why, "optim_step"));
  expect_refused(run(g, worker_ops::save_hf_model.id, caf::make_message(dir.str() + "/hf")),
                 with(why, "save_hf_model"));
  expect_refused(run(g, worker_ops::save_checkpoint.id, caf::make_message(dir.str(), int64_t{1})),
                 with(why, "save_checkpoint"));
  expect_refused(run(g, worker_ops::load_checkpoint.id, caf::make_message(dir.str(), int64_t{0})),
                 with(why, "load_checkpoint"));
  onload(g, {"model"});
  // The optimizer alone offloaded: compute works, the step and checkpoints are refused.
  offload(g, {"optimizer"});
  const std::vector<std::string> opt_why{"policy worker", "needs the optimizer state",
                                         "offloaded", "call onload"};
  expect_refused(run(g, worker_ops::optim_step.id, caf::make_message(adam(1e-2))),
                 with(opt_why, "optim_step"));
  expect_refused(run(g, worker_ops::save_checkpoint.id, caf::make_message(dir.str(), int64_t{1})),
                 with(opt_why, "save_checkpoint"));
  expect_refused(run(g, worker_ops::load_checkpoint.id, caf::make_message(dir.str(), int64_t{0})),
                 with(opt_why, "load_checkpoint"));
  forward_backward(g, batch);
  forward_backward(control, batch);
  onload(g, {});
  // Nothing the refusals touched changed: the same step as the control group.
  step(g);
  step(control);
  EXPECT_TRUE(at::equal(logprobs(g, batch), logprobs(control, batch)));
  expect_ok(run(g, worker_ops::save_hf_model.id, caf::make_message(dir.str() + "/hf")));
  expect_ok(run(g, worker_ops::load_checkpoint.id, caf::make_message(dir.str(), int64_t{0})));
}

TEST_F(WorkerOffload, BadTagsAndArgumentsAreRefusedAndNothingMoves) {
  auto policy = start("policy", "policy", 1, tiny_spec(7));
  const int64_t p = 4 * num_params_;
  expect_refused(run(policy, worker_ops::offload.id, caf::make_message(tags{"model", "weights"})),
                 {"offload", "unknown tag 'weights'", "model, optimizer"});
  expect_refused(run(policy, worker_ops::onload.id, caf::make_message(tags{"kv_cache"})),
                 {"onload", "unknown tag 'kv_cache'", "model, optimizer"});
  expect_refused(run(policy, worker_ops::offload.id, caf::make_message(std::string{"model"})),
                 {"offload expects", "tags"});
  expect_refused(run(policy, worker_ops::memory.id, caf::make_message(int64_t{1})),
                 {"memory expects"});
  auto m = memory(policy).at(0);
  EXPECT_EQ(m.resident, p); // 'model' came before the bad tag and did not move
  EXPECT_EQ(m.host, 0);

  auto ref = start("ref", "ref", 1, tiny_spec(7));
  expect_refused(run(ref, worker_ops::offload.id, caf::make_message(tags{"model", "optimizer"})),
                 {"ref", "offload", "has no optimizer", "'model'"});
  expect_refused(run(ref, worker_ops::onload.id, caf::make_message(tags{"optimizer"})),
                 {"onload", "has no optimizer"});
  expect_refused(run(ref, worker_ops::offload.id, caf::make_message(tags{"weights"})),
                 {"unknown tag 'weights' (tags: model)"});
  EXPECT_EQ(memory(ref).at(0).resident, p);
  ok(batch_call(ref, worker_ops::forward.id, make_batch(2, 8)));

  // Before init_model.
  auto raw = ok(spawn_group("raw", "critic", 1));
  expect_refused(run(raw, worker_ops::offload.id, caf::make_message(tags{})),
                 {"critic", "offload before init_model"});
  expect_refused(run(raw, worker_ops::onload.id, caf::make_message(tags{})),
                 {"onload before init_model"});
  expect_refused(run(raw, worker_ops::memory.id, caf::make_message()),
                 {"memory before init_model"});
}

TEST_F(WorkerOffload, InitModelStartsOverOnTheDevice) {
  auto g = start("policy", "policy", 1, tiny_spec(8));
  auto batch = make_batch(4, 9);
  forward_backward(g, batch);
  step(g);
  offload(g, {});
  ASSERT_EQ(memory(g).at(0).resident, 0);
  ok(g.call_all(worker_ops::init_model.id, caf::make_message(tiny_spec(8)), call_timeout));
  auto m = memory(g).at(0);
  EXPECT_EQ(m.resident, 4 * num_params_);
  EXPECT_EQ(m.host, 0);
  auto fresh = start("fresh", "policy", 1, tiny_spec(8));
  EXPECT_TRUE(at::equal(logprobs(g, batch), logprobs(fresh, batch)));
  forward_backward(g, batch);
  step(g);
}

TEST_F(WorkerOffload, LoraPolicyRoundTrip) {
  auto spec = tiny_spec(9);
  spec.lora_rank = 4;
  spec.lora_alpha = 8;
  auto g = start("a", "policy", 1, spec);
  auto control = start("b", "policy", 1, spec);
  auto batch = make_batch(4, 10);
  for (int i = 0; i < 2; ++i) {
    forward_backward(g, batch);
    forward_backward(control, batch);
    offload(g, {});
    EXPECT_EQ(memory(g).at(0).resident, 0);
    onload(g, {});
    step(g);
    step(control);
  }
  EXPECT_TRUE(at::equal(logprobs(g, batch), logprobs(control, batch)));
  test::temp_dir dir("offload");
  auto a = snapshot(g, "a", dir);
  expect_identical(a, snapshot(control, "b", dir));
  // Only the adapters train: the optimizer holds state for LoRA tensors alone.
  ASSERT_FALSE(a.at(0).optimizer.params.empty());
  for (const auto& [name, s] : a.at(0).optimizer.params)
    EXPECT_NE(name.find("lora_"), std::string::npos) << name;
}

TEST_F(WorkerOffload, TiedEmbeddingsRoundTrip) {
  auto config = be::preset("tiny");
  config.tie_word_embeddings = true;
  model_spec spec;
  spec.config_json = be::to_json(config).dump();
  spec.seed = 11;
  spec.compute_dtype = "fp32";
  auto g = start("a", "policy", 1, spec);
  auto control = start("b", "policy", 1, spec);
  auto batch = make_batch(4, 11);
  forward_backward(g, batch);
  forward_backward(control, batch);
  auto before = memory(g).at(0).resident;
  offload(g, {"model"});
  EXPECT_EQ(memory(g).at(0).host, before);
  onload(g, {"model"});
  EXPECT_EQ(memory(g).at(0).resident, before);
  step(g);
  step(control);
  EXPECT_TRUE(at::equal(logprobs(g, batch), logprobs(control, batch)));
}

TEST_F(WorkerOffload, EachDataParallelRankOffloadsItsReplica) {
  auto spec = tiny_spec(12);
  auto g = start("a", "policy", 2, spec);
  auto control = start("b", "policy", 2, spec);
  auto batch = make_batch(4, 12);
  forward_backward(g, batch);
  forward_backward(control, batch);
  step(g);
  step(control);
  forward_backward(g, batch);
  forward_backward(control, batch);
  offload(g, {});
  for (auto& m : memory(g)) {
    EXPECT_EQ(m.resident, 0);
    EXPECT_EQ(m.host, 16 * num_params_);
  }
  onload(g, {});
  for (auto& m : memory(g)) {
    EXPECT_EQ(m.resident, 16 * num_params_);
    EXPECT_EQ(m.host, 0);
  }
  step(g); // the gradient all-reduce runs over the onloaded gradients
  step(control);
  EXPECT_TRUE(at::equal(logprobs(g, batch), logprobs(control, batch)));
  test::temp_dir dir("offload");
  expect_identical(snapshot(g, "a", dir), snapshot(control, "b", dir));
}

/// `worker_model` on a rank context driven directly through the kind's ops.
TEST(WorkerModel, RefusedBeforeInitAndWhileOffloaded) {
  register_worker_kinds();
  auto kind = find_kind("policy");
  ASSERT_TRUE(kind);
  rank_context ctx;
  ctx.info.group = "policy";
  ctx.state = kind->make_state(ctx.info);
  be::testing::expect_error([&] { worker_model(ctx, "sync_weights"); },
                            {"sync_weights before init_model", "policy"});
  auto n = kind->ops.at(worker_ops::init_model.id).call(ctx, caf::make_message(tiny_spec(13)));
  ASSERT_TRUE(n);
  const auto& model = worker_model(ctx, "sync_weights");
  EXPECT_EQ(model.num_parameters(), n->get_as<int64_t>(0));
  auto weights = model.state_dict();
  ASSERT_TRUE(kind->ops.at(worker_ops::offload.id).call(ctx, caf::make_message(tags{"model"})));
  be::testing::expect_error([&] { worker_model(ctx, "sync_weights"); },
                            {"policy worker", "sync_weights", "offloaded", "onload"});
  ASSERT_TRUE(kind->ops.at(worker_ops::onload.id).call(ctx, caf::make_message(tags{})));
  const auto& back = worker_model(ctx, "sync_weights");
  EXPECT_EQ(&back, &model);
  for (const auto& [name, t] : back.state_dict())
    EXPECT_TRUE(at::equal(t, weights.at(name))) << name;
}

} // namespace
