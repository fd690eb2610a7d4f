// Eight node processes on one machine (the last in a network namespace of its own where root and
// `ip` allow): they join, a strict_spread placement group puts one bundle on each, a group of
// eight ranks (one per node process) rendezvous through its store actor and all-reduces and
// broadcasts exactly, and every node stays alive under the head's heartbeats. Figures for the
// same setup at 1, 2, 4 and 8 nodes: bench/cluster_scale_bench.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/listening_sockets.hpp"
#include "tests/cluster/network_namespace.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

constexpr int node_count = 8;

} // namespace

TEST(ClusterScale, EightNodesJoinAndOneRankOnEachAllReducesExactly) {
  // With root and `ip`, the head and nodes 1-7 listen on a veth address and node 8 runs in a
  // network namespace of its own; otherwise all eight run on 127.0.0.1.
  std::unique_ptr<network_namespace> ns;
  if (missing_requirement().empty()) {
    ns = std::make_unique<network_namespace>(1);
    if (!ns->ok)
      ns.reset();
  }
  std::vector<std::string> head_args, near_args;
  if (ns) {
    head_args = {"--bind", ns->host_ip, "--insecure"};
    near_args = {"--node-ip", ns->host_ip, "--insecure"};
  }
  test_cluster cluster{"scale", head_args};
  for (int i = 1; i <= node_count; ++i) {
    auto id = "n" + std::to_string(i);
    if (ns && i == node_count)
      cluster.add_node(id, 1, 1, {"--node-ip", ns->node_ip, "--insecure"},
                       {"ip", "netns", "exec", ns->name});
    else
      cluster.add_node(id, 1, 1, near_args);
  }
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto status = driver.status();
  for (int i = 1; i <= node_count; ++i) {
    auto n = node_status(status, "n" + std::to_string(i));
    ASSERT_FALSE(n.is_null()) << "n" << i << " missing: " << status.dump(2);
    EXPECT_TRUE(n["alive"].get<bool>()) << n.dump();
  }
  auto pg = driver.pgs().create(
      {"all", std::vector<resource_amounts>(node_count, {{"CPU", 1}}), "strict_spread", 30});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error()) << cluster.logs();
  auto nodes = bundle_nodes(*pg);
  for (int i = 0; i < node_count; ++i)
    EXPECT_EQ(nodes.at(static_cast<size_t>(i)), "n" + std::to_string(i + 1));
  actors::group_spec spec;
  spec.name = "everywhere";
  spec.kind = "policy";
  spec.placement = *pg;
  spec.threads_per_rank = 1;
  spec.placement_manager = driver.manager();
  spec.init_timeout = 60s;
  auto group = actors::actor_group::spawn(driver.sys(), spec);
  ASSERT_TRUE(group) << driver.sys().render(group.error()) << cluster.logs();
  // Rank r contributes (r + 1) * [1, 2]: the sum is 36 * [1, 2] on every rank.
  std::vector<caf::message> chunks;
  for (int r = 0; r < node_count; ++r)
    chunks.push_back(caf::make_message(tensor_list{f32_blob({1.0f * (r + 1), 2.0f * (r + 1)})}));
  auto sums = group->call_mesh(actors::rank_ops::all_reduce.id, chunks, 60s);
  ASSERT_TRUE(sums) << driver.sys().render(sums.error()) << cluster.logs();
  ASSERT_EQ(sums->size(), static_cast<size_t>(node_count));
  for (auto& m : *sums)
    EXPECT_EQ(floats(m.get_as<tensor_list>(0).at(0)), (std::vector<float>{36, 72}));
  // A broadcast from the last rank (the namespaced node when there is one).
  std::vector<caf::message> from_last;
  for (int r = 0; r < node_count; ++r)
    from_last.push_back(caf::make_message(
        tensor_list{f32_blob({r == node_count - 1 ? 5.0f : 0.0f, 0.0f})}, int32_t{node_count - 1}));
  auto bc = group->call_mesh(actors::rank_ops::broadcast.id, from_last, 60s);
  ASSERT_TRUE(bc) << driver.sys().render(bc.error());
  for (auto& m : *bc)
    EXPECT_EQ(floats(m.get_as<tensor_list>(0).at(0)), (std::vector<float>{5, 0}));
  // Nothing listens on a wildcard address, in any of the ten processes.
  std::vector<pid_t> pids{cluster.head().pid(), ::getpid()};
  for (int i = 1; i <= node_count; ++i)
    pids.push_back(cluster.node("n" + std::to_string(i)).pid());
  for (auto pid : pids)
    for (auto& s : listening_sockets(pid))
      EXPECT_FALSE(s.wildcard) << "pid " << pid << ": " << describe(listening_sockets(pid));
  // Every node counts its rank, and all stay alive under the heartbeats.
  EXPECT_TRUE(eventually([&] { return driver.status(); },
                         [](const nlohmann::json& s) {
                           for (int i = 1; i <= node_count; ++i) {
                             auto n = node_status(s, "n" + std::to_string(i));
                             if (n.is_null() || !n["alive"].get<bool>() || n["ranks"] != 1)
                               return false;
                           }
                           return true;
                         },
                         20s))
    << driver.status().dump(2);
  group->stop();
  ASSERT_TRUE(driver.pgs().remove("all"));
}
