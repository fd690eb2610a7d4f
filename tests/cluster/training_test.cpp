// Training through the dispatcher with a policy group whose two DP ranks run on two node
// processes (gradients all-reduced by Gloo across the processes): the same losses as the same
// job on one node, to 1e-6; a checkpoint saved across the nodes resumes to the same losses; a
// resume whose files one rank cannot see is refused, naming the path and the node, and changes
// nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <thread>
#include <random>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/batch_wire.hpp"
#include "actors/dispatcher.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::string model_json() {
  return nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"vocab_size", 16},
                        {"hidden_size", 32},
                        {"intermediate_size", 64},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"max_position_embeddings", 32},
                        {"tie_word_embeddings", false}}
    .dump();
}

/// Reverse-the-digits batches, the same sequence for every run with one seed.
backends::training_batch batch(std::mt19937_64& rng) {
  std::vector<std::vector<int64_t>> prompts, responses;
  std::uniform_int_distribution<int> len(2, 5), digit(1, 10);
  for (int i = 0; i < 8; ++i) {
    std::vector<int64_t> d(static_cast<size_t>(len(rng)));
    for (auto& x : d)
      x = digit(rng);
    std::vector<int64_t> p{12};
    p.insert(p.end(), d.begin(), d.end());
    p.push_back(11);
    std::vector<int64_t> r(d.rbegin(), d.rend());
    r.push_back(13);
    prompts.push_back(std::move(p));
    responses.push_back(std::move(r));
  }
  return backends::from_sequences(prompts, responses);
}

/// A policy group of two DP ranks on `pg` behind a dispatcher.
struct trainer {
  trainer(caf::actor_system& sys, const placement_group_info& pg, const caf::actor& manager)
    : dispatcher(actors::spawn_dispatcher(sys)), client(sys, dispatcher, 120s) {
    actors::group_spec spec;
    spec.name = "policy";
    spec.kind = "policy";
    spec.placement = pg;
    spec.threads_per_rank = 1;
    spec.placement_manager = manager;
    auto g = actors::actor_group::spawn(sys, spec);
    if (!g) {
      error = sys.render(g.error());
      return;
    }
    group = *g;
    if (auto r = client.register_group("policy", group); !r) {
      error = sys.render(r.error());
      return;
    }
    model_spec m;
    m.config_json = model_json();
    m.seed = 5;
    if (auto r = client.init_model("policy", m); !r)
      error = sys.render(r.error());
  }
  ~trainer() {
    group.stop();
    caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
  }

  /// One SFT step; its loss (NaN and `error` set on failure).
  double step(std::mt19937_64& rng) {
    auto b = batch(rng);
    auto out = client.forward_backward("policy", b, "cross_entropy");
    if (!out) {
      error = caf::to_string(out.error());
      return std::nan("");
    }
    backends::adam_params adam;
    adam.learning_rate = 1e-2;
    auto s = client.optim_step("policy", adam);
    if (!s) {
      error = caf::to_string(s.error());
      return std::nan("");
    }
    return out->metric("loss:sum");
  }

  caf::actor dispatcher;
  actors::trainer_client client;
  actors::actor_group group;
  std::string error;
};

/// Two one-GPU bundles on the embedded node.
placement_group_info local_pg() {
  placement_group_info pg;
  pg.name = "local";
  pg.strategy = "pack";
  for (int i = 0; i < 2; ++i)
    pg.bundles.push_back({static_cast<uint32_t>(i), "node0", {i}, {{"GPU", 1.0}, {"CPU", 1.0}}});
  return pg;
}

class ClusterTraining : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    cluster_ = new test_cluster("training");
    cluster_->add_node("n1", 1, 2);
    cluster_->add_node("n2", 1, 2);
    driver_ = new test_driver(cluster_->endpoint());
  }
  static void TearDownTestSuite() {
    delete driver_;
    delete cluster_;
  }
  void SetUp() override {
    ASSERT_TRUE(driver_->error().empty()) << driver_->error() << "\n" << cluster_->logs();
  }
  static test_cluster* cluster_;
  static test_driver* driver_;
};

test_cluster* ClusterTraining::cluster_ = nullptr;
test_driver* ClusterTraining::driver_ = nullptr;

} // namespace

TEST_F(ClusterTraining, SftAcrossTwoNodesGivesTheLossesOfOneNode) {
  constexpr int steps = 6;
  std::vector<double> local, remote;
  {
    runtime::system_config cfg;
    ASSERT_FALSE(cfg.parse_args({}));
    caf::actor_system sys{cfg};
    trainer t{sys, local_pg(), caf::actor{}};
    ASSERT_TRUE(t.error.empty()) << t.error;
    std::mt19937_64 rng(7);
    for (int s = 0; s < steps; ++s)
      local.push_back(t.step(rng));
    ASSERT_TRUE(t.error.empty()) << t.error;
  }
  auto pg = driver_->pgs().create({"sft", {{{"GPU", 1}, {"CPU", 1}}, {{"GPU", 1}, {"CPU", 1}}},
                                   "strict_spread", 10});
  ASSERT_TRUE(pg) << driver_->sys().render(pg.error());
  ASSERT_EQ(bundle_nodes(*pg), (std::vector<std::string>{"n1", "n2"}));
  {
    trainer t{driver_->sys(), *pg, driver_->manager()};
    ASSERT_TRUE(t.error.empty()) << t.error << "\n" << cluster_->logs();
    std::mt19937_64 rng(7);
    for (int s = 0; s < steps; ++s)
      remote.push_back(t.step(rng));
    ASSERT_TRUE(t.error.empty()) << t.error << "\n" << cluster_->logs();
  }
  ASSERT_TRUE(driver_->pgs().remove("sft"));
  ASSERT_EQ(local.size(), remote.size());
  for (int s = 0; s < steps; ++s)
    EXPECT_NEAR(local[s], remote[s], 1e-6 * std::max(1.0, std::abs(local[s]))) << "step " << s;
}

TEST_F(ClusterTraining, ACheckpointSavedAcrossNodesResumesAndAnUnreachableOneIsRefused) {
  auto root = cluster_->dir() + "/ckpt";
  auto pg = driver_->pgs().create({"ckpt", {{{"GPU", 1}, {"CPU", 1}}, {{"GPU", 1}, {"CPU", 1}}},
                                   "strict_spread", 10});
  ASSERT_TRUE(pg) << driver_->sys().render(pg.error());
  trainer t{driver_->sys(), *pg, driver_->manager()};
  ASSERT_TRUE(t.error.empty()) << t.error << "\n" << cluster_->logs();
  std::mt19937_64 rng(11);
  for (int s = 0; s < 2; ++s)
    t.step(rng);
  ASSERT_TRUE(t.client.save_checkpoint(root, 2, {"policy"}));
  // Each rank wrote its directory from its own node's process.
  EXPECT_TRUE(fs::exists(root + "/global_step_2/policy/rank_0/meta.json"));
  EXPECT_TRUE(fs::exists(root + "/global_step_2/policy/rank_1/meta.json"));
  EXPECT_TRUE(fs::exists(root + "/latest_global_step.txt"));
  auto rng_at_save = rng;
  std::vector<double> after{t.step(rng), t.step(rng)};
  auto loaded = t.client.load_checkpoint(root, -1, {"policy"});
  ASSERT_TRUE(loaded) << driver_->sys().render(loaded.error());
  EXPECT_EQ(*loaded, 2);
  rng = rng_at_save;
  std::vector<double> again{t.step(rng), t.step(rng)};
  EXPECT_EQ(after, again);
  ASSERT_TRUE(t.error.empty()) << t.error;

  // Rank 1 (on n2) can no longer see its directory (a per-node directory that is missing there).
  fs::rename(root + "/global_step_2/policy/rank_1", root + "/rank_1_elsewhere");
  // The loss on a fixed batch, without gradients, before and after the refused resume.
  std::mt19937_64 fixed(99);
  auto probe = actors::to_payload(batch(fixed));
  ASSERT_TRUE(probe);
  loss_request ce{"cross_entropy", {}, {}};
  auto before = t.client.forward("policy", *probe, ce);
  ASSERT_TRUE(before) << driver_->sys().render(before.error());
  auto refused = t.client.load_checkpoint(root, 2, {"policy"});
  ASSERT_FALSE(refused);
  auto msg = error_message(refused.error());
  EXPECT_TRUE(is(refused.error(), errc::not_found)) << msg;
  EXPECT_NE(msg.find(root + "/global_step_2/policy/rank_1/meta.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'n2'"), std::string::npos) << msg;
  // Nothing was loaded, on either rank: the same loss on the same batch.
  auto after_refusal = t.client.forward("policy", *probe, ce);
  ASSERT_TRUE(after_refusal) << driver_->sys().render(after_refusal.error());
  EXPECT_EQ(before->metric("loss:sum"), after_refusal->metric("loss:sum"));
  // Once the directory is back the resume works (and changes the weights).
  fs::rename(root + "/rank_1_elsewhere", root + "/global_step_2/policy/rank_1");
  ASSERT_TRUE(t.client.load_checkpoint(root, 2, {"policy"}));
  auto reloaded = t.client.forward("policy", *probe, ce);
  ASSERT_TRUE(reloaded);
  EXPECT_NE(reloaded->metric("loss:sum"), before->metric("loss:sum"));
  ASSERT_TRUE(t.error.empty()) << t.error;
  t.group.stop();
  ASSERT_TRUE(driver_->pgs().remove("ckpt"));
}

TEST_F(ClusterTraining, TwoDriversTrainingAtOnceEachGetTheLossesOfTheirWorkAlone) {
  constexpr int steps = 4;
  // Alone, embedded: the reference for both seeds.
  std::map<uint64_t, std::vector<double>> alone;
  for (uint64_t seed : {21u, 22u}) {
    runtime::system_config cfg;
    ASSERT_FALSE(cfg.parse_args({}));
    caf::actor_system sys{cfg};
    trainer t{sys, local_pg(), caf::actor{}};
    ASSERT_TRUE(t.error.empty()) << t.error;
    std::mt19937_64 rng(seed);
    for (int s = 0; s < steps; ++s)
      alone[seed].push_back(t.step(rng));
  }
  // Two drivers (two actor systems, two sessions) on the same two nodes at the same time; each
  // group spans both node processes.
  test_driver second{cluster_->endpoint()};
  ASSERT_TRUE(second.error().empty()) << second.error();
  std::map<uint64_t, std::vector<double>> together;
  std::map<uint64_t, std::string> errors;
  auto run = [&](test_driver& d, uint64_t seed) {
    auto name = "both-" + std::to_string(seed);
    auto pg = d.pgs().create({name, {{{"CPU", 1}}, {{"CPU", 1}}}, "strict_spread", 30});
    if (!pg) {
      errors[seed] = d.sys().render(pg.error());
      return;
    }
    {
      trainer t{d.sys(), *pg, d.manager()};
      std::mt19937_64 rng(seed);
      for (int s = 0; s < steps && t.error.empty(); ++s)
        together[seed].push_back(t.step(rng));
      errors[seed] = t.error;
    }
    d.pgs().remove(name);
  };
  // Each thread writes its own map entries only (created before the threads start).
  together[21];
  together[22];
  errors[21];
  errors[22];
  std::thread a([&] { run(*driver_, 21); });
  std::thread b([&] { run(second, 22); });
  a.join();
  b.join();
  for (uint64_t seed : {21u, 22u}) {
    ASSERT_TRUE(errors[seed].empty()) << errors[seed] << "\n" << cluster_->logs();
    ASSERT_EQ(together[seed].size(), alone[seed].size());
    for (int s = 0; s < steps; ++s)
      EXPECT_NEAR(together[seed][s], alone[seed][s], 1e-6 * std::max(1.0, std::abs(alone[seed][s])))
        << "seed " << seed << " step " << s;
  }
}
