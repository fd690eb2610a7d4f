// Failures of a cluster's processes (each test starts its own head and nodes on 127.0.0.1):
// a node SIGKILLed during a forward_backward, an engine's node SIGKILLed during Gloo weight
// syncs, a node hung by SIGSTOP, a killed node that comes
// back, a killed driver, a killed head. Every call fails within its deadline with an error
// naming what died; nothing hangs; reservations and ranks are freed.
#include <gtest/gtest.h>

#include <signal.h>

#include <future>
#include <random>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/trainer_client.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// The heartbeat settings of rlforge's defaults (a hung node is dead after 1 s).
const std::vector<std::string> default_heartbeats{"--heartbeat-ms", "200", "--dead-after-ms",
                                                  "1000"};

std::string config_json(int hidden) {
  return nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"vocab_size", 64},
                        {"hidden_size", hidden},
                        {"intermediate_size", 2 * hidden},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"max_position_embeddings", 128},
                        {"tie_word_embeddings", false}}
    .dump();
}

backends::training_batch big_batch() {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> tok(1, 60);
  std::vector<std::vector<int64_t>> prompts(64), responses(64);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].resize(48);
    responses[i].resize(48);
    for (auto& t : prompts[i])
      t = tok(rng);
    for (auto& t : responses[i])
      t = tok(rng);
  }
  return backends::from_sequences(prompts, responses);
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

std::string pg_state(const nlohmann::json& status, const std::string& name) {
  for (auto& g : status.value("placement_groups", nlohmann::json::array()))
    if (g["name"] == name)
      return g["state"];
  return "absent";
}

} // namespace

TEST(ClusterFailures, ANodeKilledDuringForwardBackwardFailsTheCallNamingTheNode) {
  test_cluster cluster{"kill"};
  cluster.add_node("n1", 1, 2);
  cluster.add_node("n2", 1, 2);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto pg = driver.pgs().create(
    {"train", {{{"GPU", 1}, {"CPU", 1}}, {{"GPU", 1}, {"CPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  auto group = driver.spawn_group("policy", "policy", *pg, /*reserve=*/true);
  ASSERT_TRUE(group) << driver.sys().render(group.error()) << cluster.logs();
  auto dispatcher = actors::spawn_dispatcher(driver.sys());
  const auto deadline = 60s;
  actors::trainer_client client{driver.sys(), dispatcher, deadline};
  ASSERT_TRUE(client.register_group("policy", *group));
  model_spec m;
  m.config_json = config_json(128);
  ASSERT_TRUE(client.init_model("policy", m));
  auto batch = big_batch();
  ASSERT_TRUE(client.forward_backward("policy", batch, "cross_entropy")); // warm
  // forward_backward back to back until one fails; n2 is killed while they run.
  auto calls = std::async(std::launch::async, [&] {
    for (int i = 0; i < 200; ++i) {
      auto out = client.forward_backward("policy", batch, "cross_entropy");
      if (!out)
        return std::make_pair(out.error(), clock_type::now());
    }
    return std::make_pair(caf::error{}, clock_type::now());
  });
  std::this_thread::sleep_for(500ms);
  auto killed = clock_type::now();
  cluster.node("n2").kill();
  ASSERT_EQ(calls.wait_for(deadline + 10s), std::future_status::ready) << "the call hung";
  auto [err, failed_at] = calls.get();
  ASSERT_TRUE(err) << "no call failed after the node was killed";
  auto latency = std::chrono::duration<double>(failed_at - killed).count();
  auto msg = error_message(err);
  std::printf("[ figure   ] call failed %.3f s after SIGKILL: %s\n", latency, msg.c_str());
  EXPECT_LT(latency, std::chrono::duration<double>(deadline).count()) << "not within the deadline";
  EXPECT_TRUE(is(err, errc::rank_failed)) << msg;
  EXPECT_NE(msg.find("op 'forward_backward'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("group 'policy' rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'n2'"), std::string::npos) << msg;
  // The head: n2 dead, its resources gone, the placement group failed, the group shown failed.
  EXPECT_TRUE(eventually([&] { return driver.status(); },
                         [](const nlohmann::json& s) {
                           return node_status(s, "n2")["alive"] == false
                                  && pg_state(s, "train") == "failed";
                         },
                         10s))
    << driver.status().dump(2);
  auto status = driver.status();
  for (auto& g : status["actor_groups"]) {
    if (g["name"] == "policy") {
      EXPECT_NE(g["state"].get<std::string>().find("node 'n2' died"), std::string::npos);
    }
  }
  auto gone = driver.pgs().get("train");
  ASSERT_FALSE(gone);
  EXPECT_NE(error_message(gone.error()).find("node 'n2'"), std::string::npos);
  // Later calls fail at once, naming the dead rank's node; the cluster keeps serving.
  auto later = client.forward_backward("policy", batch, "cross_entropy");
  ASSERT_FALSE(later);
  EXPECT_NE(error_message(later.error()).find("node 'n2'"), std::string::npos);
  group->stop();
  caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
  ASSERT_TRUE(driver.pgs().remove("train"));
  auto on_n1 = driver.pgs().create({"after", {{{"GPU", 1}}}, "pack", 10});
  ASSERT_TRUE(on_n1) << driver.sys().render(on_n1.error());
  EXPECT_EQ(on_n1->bundles[0].node_id, "n1");
}

TEST(ClusterFailures, AnEnginesNodeKilledDuringGlooSyncsFailsTheSyncNamingTheRank) {
  test_cluster cluster{"kill_sync"};
  cluster.add_node("n1", 1, 2);
  cluster.add_node("n2", 1, 2);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto pg = driver.pgs().create(
    {"sync", {{{"GPU", 1}, {"CPU", 1}}, {{"GPU", 1}, {"CPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  auto bundle = [&](size_t i) {
    auto one = *pg;
    one.bundles = {pg->bundles.at(i)};
    return one;
  };
  ASSERT_EQ(pg->bundles.at(1).node_id, "n2");
  auto policy = driver.spawn_group("policy", "policy", bundle(0), /*reserve=*/true);
  ASSERT_TRUE(policy) << driver.sys().render(policy.error()) << cluster.logs();
  auto engines = driver.spawn_group("engines", "engine", bundle(1), /*reserve=*/true);
  ASSERT_TRUE(engines) << driver.sys().render(engines.error()) << cluster.logs();
  auto dispatcher = actors::spawn_dispatcher(driver.sys());
  const auto deadline = 60s;
  actors::trainer_client client{driver.sys(), dispatcher, deadline};
  ASSERT_TRUE(client.register_group("policy", *policy));
  ASSERT_TRUE(client.register_engines(*engines));
  model_spec m;
  m.compute_dtype = "fp32";
  m.config_json = config_json(256); // a sync of a few MB: tens of them while the kill lands
  ASSERT_TRUE(client.init_model("policy", m));
  ASSERT_TRUE(client.init_model("engines", m));
  ASSERT_TRUE(client.set_weight_transport("gloo"));
  ASSERT_TRUE(client.save_weights_for_sampler("policy")); // opens the channel
  // Syncs back to back until one fails; n2 (the engine's node) is killed while they run.
  auto syncs = std::async(std::launch::async, [&] {
    for (int i = 0; i < 2000; ++i) {
      auto v = client.save_weights_for_sampler("policy");
      if (!v)
        return v.error();
    }
    return caf::error{};
  });
  std::this_thread::sleep_for(300ms);
  cluster.node("n2").kill();
  ASSERT_EQ(syncs.wait_for(deadline + 10s), std::future_status::ready) << "the sync hung";
  auto err = syncs.get();
  ASSERT_TRUE(err) << "no sync failed after the engine's node was killed";
  auto msg = error_message(err);
  std::printf("[ figure   ] the sync failed: %s\n", msg.c_str());
  EXPECT_TRUE(is(err, errc::rank_failed)) << msg;
  EXPECT_NE(msg.find("op 'save_weights_for_sampler'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  // The trainer goes on: its ranks train, and the next sync says no engine is left, naming it.
  ASSERT_TRUE(client.forward_backward("policy", big_batch(), "cross_entropy"));
  auto next = client.save_weights_for_sampler("policy");
  ASSERT_FALSE(next);
  EXPECT_NE(error_message(next.error()).find("no engine rank is left alive"), std::string::npos)
      << error_message(next.error());
  EXPECT_NE(error_message(next.error()).find("rank 0"), std::string::npos)
      << error_message(next.error());
  policy->stop();
  engines->stop();
  caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
}

TEST(ClusterFailures, AHungNodeIsDeclaredDeadAndRejoinsWhenItWakes) {
  test_cluster cluster{"stop", default_heartbeats};
  cluster.add_node("n1", 1, 1, default_heartbeats);
  cluster.add_node("n2", 1, 1, default_heartbeats);
  test_driver driver{cluster.endpoint(), default_heartbeats};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto pg = driver.pgs().create({"on-n2", {{{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg);
  auto target = pg->bundles[0].node_id;
  auto group = driver.spawn_group("g", "ref", *pg);
  ASSERT_TRUE(group) << driver.sys().render(group.error());
  auto stopped = clock_type::now();
  cluster.node(target).signal(SIGSTOP);
  double detected = -1;
  bool dead = eventually(
    [&] { return driver.status(); },
    [&](const nlohmann::json& s) {
      if (node_status(s, target)["alive"] == false && detected < 0)
        detected = seconds_since(stopped);
      return detected >= 0;
    },
    15s);
  cluster.node(target).signal(SIGCONT);
  ASSERT_TRUE(dead) << driver.status().dump(2) << cluster.logs();
  std::printf("[ figure   ] SIGSTOP: node declared dead after %.2f s (poll every 0.1 s)\n",
              detected);
  auto status = driver.status();
  EXPECT_EQ(pg_state(status, "on-n2"), "failed") << status.dump(2);
  // Awake again, the node finds it lost its place and joins again.
  ASSERT_TRUE(cluster.node(target).wait_for_log("rejoined cluster", 30s)) << cluster.logs();
  EXPECT_TRUE(eventually([&] { return driver.status(); },
                         [&](const nlohmann::json& s) {
                           return node_status(s, target)["alive"] == true;
                         },
                         10s));
  // Back with no ranks: the group that had its rank there stays failed, as its placement group.
  status = driver.status();
  EXPECT_EQ(node_status(status, target)["ranks"], 0) << status.dump(2);
  EXPECT_EQ(pg_state(status, "on-n2"), "failed") << status.dump(2);
  ASSERT_EQ(status["actor_groups"].size(), 1u) << status.dump(2);
  EXPECT_EQ(status["actor_groups"][0]["state"].get<std::string>().rfind(
                "failed: node '" + target + "' died", 0),
            0u)
    << status.dump(2);
  group->stop();
}

TEST(ClusterFailures, AKilledNodeThatRestartsHostsNewGroups) {
  test_cluster cluster{"rejoin"};
  cluster.add_node("n1", 1, 1);
  cluster.add_node("n2", 1, 1);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error();
  cluster.node("n2").kill();
  ASSERT_TRUE(eventually([&] { return driver.status(); },
                         [](const nlohmann::json& s) {
                           return node_status(s, "n2")["alive"] == false;
                         },
                         15s));
  // While n2 is gone a two-node group cannot be placed.
  auto too_early = driver.pgs().create({"both", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 1});
  ASSERT_FALSE(too_early);
  cluster.add_node("n2", 1, 1);
  ASSERT_TRUE(eventually([&] { return driver.status(); },
                         [](const nlohmann::json& s) {
                           return node_status(s, "n2")["alive"] == true;
                         },
                         15s))
    << cluster.logs();
  auto pg = driver.pgs().create({"both", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  auto group = driver.spawn_group("g", "ref", *pg);
  ASSERT_TRUE(group) << driver.sys().render(group.error()) << cluster.logs();
  auto where = group->call_all(actors::rank_ops::location.id, caf::message{}, 10s);
  ASSERT_TRUE(where);
  EXPECT_EQ((*where)[1].get_as<int64_t>(1), cluster.node("n2").pid());
  group->stop();
}

TEST(ClusterFailures, AKilledDriverLeavesNoRanksOrReservationsBehind) {
  test_cluster cluster{"driver"};
  cluster.add_node("n1", 2, 2);
  cluster.add_node("n2", 2, 2);
  test_driver observer{cluster.endpoint()};
  ASSERT_TRUE(observer.error().empty()) << observer.error();
  // A real driver program: SFT with two ranks on the cluster, killed in the middle.
  child_process sft({sft_example_binary(), "--cluster", cluster.endpoint(), "--steps", "100000",
                     "--ranks", "2", "--metrics", cluster.dir() + "/sft.jsonl"},
                    cluster.dir() + "/sft.log", {{"OMP_WAIT_POLICY", "PASSIVE"}});
  ASSERT_TRUE(sft.wait_for_log("step 3/", 60s)) << sft.log() << cluster.logs();
  // The nodes count the driver's two ranks (their census comes with the next heartbeat).
  EXPECT_TRUE(eventually([&] { return observer.status(); },
                         [](const nlohmann::json& s) {
                           int ranks = 0;
                           for (auto& n : s["nodes"])
                             ranks += n["ranks"].get<int>();
                           return ranks == 2;
                         },
                         10s))
    << observer.status().dump(2);
  auto busy = observer.status();
  EXPECT_EQ(busy["drivers"].size(), 2u) << busy.dump(2);
  EXPECT_FALSE(busy["placement_groups"].empty()) << busy.dump(2);
  sft.kill();
  EXPECT_TRUE(eventually([&] { return observer.status(); },
                         [](const nlohmann::json& s) {
                           int ranks = 0;
                           for (auto& n : s["nodes"])
                             ranks += n["ranks"].get<int>();
                           return ranks == 0 && s["placement_groups"].empty()
                                  && s["actor_groups"].empty() && s["drivers"].size() == 1;
                         },
                         20s))
    << observer.status().dump(2) << cluster.logs();
  // Every GPU is free again.
  auto status = observer.status();
  for (auto& n : status["nodes"])
    EXPECT_EQ(n["available"]["GPU"], n["total"]["GPU"]) << status.dump(2);
}

TEST(ClusterFailures, AKilledHeadStopsTheRanksAndTheNodesRejoinItsSuccessor) {
  // Without a head grace the nodes stop their ranks at once (head_restart_test.cpp: with one).
  test_cluster cluster{"head"};
  cluster.add_node("n1", 1, 1, {"--head-grace-ms", "0"});
  cluster.add_node("n2", 1, 1, {"--head-grace-ms", "0"});
  {
    test_driver driver{cluster.endpoint()};
    ASSERT_TRUE(driver.error().empty()) << driver.error();
    auto pg = driver.pgs().create({"both", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
    ASSERT_TRUE(pg);
    auto group = driver.spawn_group("g", "ref", *pg);
    ASSERT_TRUE(group) << driver.sys().render(group.error());
    cluster.head().kill();
    // The nodes stop their ranks: the driver's calls fail naming the group, rank and node.
    ASSERT_TRUE(cluster.node("n1").wait_for_log("lost the head", 15s)) << cluster.logs();
    bool failed = false;
    for (int i = 0; i < 100 && !failed; ++i) {
      auto r = group->call_all(actors::rank_ops::ping.id, caf::message{}, 5s);
      failed = !r;
      if (!r) {
        EXPECT_NE(error_message(r.error()).find("group 'g' rank"), std::string::npos)
          << error_message(r.error());
      }
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE(failed) << "the ranks outlived the head";
    // The driver gets a clear error from the placement API.
    auto pgs = driver.pgs().create({"x", {{{"GPU", 1}}}, "pack", 5});
    ASSERT_FALSE(pgs);
    EXPECT_NE(error_message(pgs.error()).find("head at " + cluster.endpoint() + " is lost"),
              std::string::npos)
      << driver.sys().render(pgs.error());
    group->stop();
  }
  // A new head on the same port: the nodes join it by themselves.
  cluster.restart_head();
  ASSERT_TRUE(cluster.node("n1").wait_for_log("rejoined cluster", 30s)) << cluster.logs();
  ASSERT_TRUE(cluster.node("n2").wait_for_log("rejoined cluster", 30s)) << cluster.logs();
  test_driver again{cluster.endpoint()};
  ASSERT_TRUE(again.error().empty()) << again.error();
  auto pg = again.pgs().create({"both", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << again.sys().render(pg.error());
}
