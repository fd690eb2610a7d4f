// "Another host": a node in a network namespace of its own (a veth pair, its own address), so
// it shares the machine but not the network namespace with the trainer's node. The shared-memory
// transport's abstract socket is per namespace, so weight sync must choose Gloo; the engine then
// holds exactly the trainer's weights. Needs root and `ip` (iproute2); skips naming what is
// missing otherwise.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/trainer_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/network_namespace.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

caf::expected<tensor_map> weights_of(caf::actor_system& sys, actors::actor_group& g) {
  auto r = g.call_all(actors::engine_ops::get_weights.id, caf::message{}, 30s);
  if (!r)
    return std::move(r.error());
  return r->at(0).get_as<tensor_map>(0);
}

} // namespace

TEST(ClusterNetns, ANodeInAnotherNetworkNamespaceGetsItsWeightsOverGloo) {
  if (auto missing = missing_requirement(); !missing.empty())
    GTEST_SKIP() << "needs " << missing;
  network_namespace ns;
  if (!ns.created)
    GTEST_SKIP() << "needs the right to create network namespaces (`ip netns add` failed: "
                    "CAP_SYS_ADMIN is missing in this container)";
  ASSERT_TRUE(ns.ok) << "could not set up the veth pair of network namespace " << ns.name;
  // Listening beyond loopback without TLS needs --insecure (a test network of our own).
  test_cluster cluster{"netns", {"--bind", ns.host_ip, "--insecure"}};
  cluster.add_node("host", 1, 1, {"--node-ip", ns.host_ip, "--insecure"});
  auto& far = cluster.add_node("far", 1, 1, {"--node-ip", ns.node_ip, "--insecure"},
                               {"ip", "netns", "exec", ns.name});
  ASSERT_TRUE(far.wait_for_log("joined cluster", 1ms)) << cluster.logs();
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto pg = driver.pgs().create({"sync", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  auto on = [&](const std::string& node) {
    auto one = *pg;
    one.bundles.clear();
    for (auto& b : pg->bundles)
      if (b.node_id == node)
        one.bundles.push_back(b);
    return one;
  };
  auto spawn = [&](const std::string& name, const std::string& kind, const std::string& node) {
    actors::group_spec spec;
    spec.name = name;
    spec.kind = kind;
    spec.placement = on(node);
    spec.threads_per_rank = 1;
    spec.gpu_per_rank = 0.5;
    spec.collectives = kind != "engine";
    spec.placement_manager = driver.manager();
    return actors::actor_group::spawn(driver.sys(), spec);
  };
  auto policy = spawn("policy", "policy", "host");
  ASSERT_TRUE(policy) << driver.sys().render(policy.error()) << cluster.logs();
  auto engines = spawn("engines", "engine", "far");
  ASSERT_TRUE(engines) << driver.sys().render(engines.error()) << cluster.logs();
  // A second engine beside the policy, never synced: it holds the policy's initial weights.
  auto witness = spawn("witness", "engine", "host");
  ASSERT_TRUE(witness) << driver.sys().render(witness.error());
  auto dispatcher = actors::spawn_dispatcher(driver.sys());
  actors::trainer_client client{driver.sys(), dispatcher, 60s};
  ASSERT_TRUE(client.register_group("policy", *policy));
  ASSERT_TRUE(client.register_engines(*engines));
  model_spec m;
  m.preset = "tiny";
  m.seed = 5;
  ASSERT_TRUE(client.init_model("policy", m));
  ASSERT_TRUE(witness->call_all(actors::worker_ops::init_model.id, caf::make_message(m), 60s));
  m.seed = 6; // the far engine starts with other weights
  ASSERT_TRUE(client.init_model("engines", m));
  auto before = weights_of(driver.sys(), *engines);
  auto expected = weights_of(driver.sys(), *witness);
  ASSERT_TRUE(before && expected);
  ASSERT_NE(*before, *expected);
  auto version = client.save_weights_for_sampler("policy");
  ASSERT_TRUE(version) << driver.sys().render(version.error()) << cluster.logs();
  EXPECT_EQ(*version, 1);
  auto status = client.status();
  ASSERT_TRUE(status);
  EXPECT_EQ((*status)["last_sync"]["engines/0"], "gloo") << status->dump(2);
  auto after = weights_of(driver.sys(), *engines);
  ASSERT_TRUE(after);
  EXPECT_TRUE(*after == *expected) << "the far engine does not hold the policy's weights";
  for (auto* g : {&*policy, &*engines, &*witness})
    g->stop();
  caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
}
