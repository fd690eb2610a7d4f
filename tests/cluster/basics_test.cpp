// A head and two node processes on 127.0.0.1, this test process as the driver: placement groups
// with each strategy across the nodes, a group with ranks on both nodes (calls, mesh calls,
// all-reduce with Gloo after a rendezvous through a store actor), a Gloo weight channel between
// the nodes opened once for every sync, no listening socket on a wildcard address in any of the
// processes, what `rlforge status` reports, and bad input to the placement API (refused, the
// cluster keeps serving).
#include <gtest/gtest.h>

#include <signal.h>

#include <cstring>
#include <thread>

#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/trainer_client.hpp"
#include "runtime/errc.hpp"
#include "service/tinker_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/listening_sockets.hpp"
#include "tests/runtime/prometheus_parse.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

class ClusterBasics : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    cluster_ = new test_cluster("basics");
    cluster_->add_node("n1", 2, 4);
    cluster_->add_node("n2", 2, 4);
    driver_ = new test_driver(cluster_->endpoint());
  }
  static void TearDownTestSuite() {
    delete driver_;
    delete cluster_;
    driver_ = nullptr;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(driver_->error().empty()) << driver_->error() << "\n" << cluster_->logs();
  }

  static placement_group_info create(const std::string& name, int bundles, double gpu,
                                     const std::string& strategy) {
    std::vector<resource_amounts> b(static_cast<size_t>(bundles), {{"GPU", gpu}, {"CPU", 1}});
    auto pg = driver_->pgs().create({name, b, strategy, 10});
    EXPECT_TRUE(pg) << (pg ? "" : driver_->sys().render(pg.error())) << "\n" << cluster_->logs();
    return pg ? *pg : placement_group_info{};
  }

  /// No process of the cluster (head, nodes, this driver) listens on a wildcard address.
  static void expect_no_wildcard_listener(const std::string& when) {
    std::vector<std::pair<std::string, pid_t>> processes{
      {"head", cluster_->head().pid()},
      {"n1", cluster_->node("n1").pid()},
      {"n2", cluster_->node("n2").pid()},
      {"driver", ::getpid()}};
    for (auto& [name, pid] : processes) {
      auto sockets = listening_sockets(pid);
      EXPECT_FALSE(sockets.empty() && name != "driver") << name << " " << when;
      for (auto& s : sockets)
        EXPECT_FALSE(s.wildcard) << name << " listens on a wildcard address " << when << ": "
                                 << describe(sockets);
    }
  }

  static test_cluster* cluster_;
  static test_driver* driver_;
};

test_cluster* ClusterBasics::cluster_ = nullptr;
test_driver* ClusterBasics::driver_ = nullptr;

} // namespace

TEST_F(ClusterBasics, EveryStrategyPlacesAcrossTheNodesOrderedByNodeAndDevice) {
  // Each node has 2 GPUs; n1 joined first.
  auto spread = create("strict-spread", 2, 1, "strict_spread");
  EXPECT_EQ(bundle_nodes(spread), (std::vector<std::string>{"n1", "n2"}));
  ASSERT_TRUE(driver_->pgs().remove("strict-spread"));
  auto packed = create("strict-pack", 2, 1, "strict_pack");
  auto nodes = bundle_nodes(packed);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0], nodes[1]);
  EXPECT_NE(packed.bundles[0].device_ids, packed.bundles[1].device_ids);
  ASSERT_TRUE(driver_->pgs().remove("strict-pack"));
  // Three GPUs: pack fills one node, then the next; bundles ordered by (node, device).
  auto pack = create("pack", 3, 1, "pack");
  EXPECT_EQ(bundle_nodes(pack), (std::vector<std::string>{"n1", "n1", "n2"}));
  ASSERT_EQ(pack.bundles.size(), 3u);
  EXPECT_EQ(pack.bundles[0].device_ids, std::vector<int32_t>{0});
  EXPECT_EQ(pack.bundles[1].device_ids, std::vector<int32_t>{1});
  ASSERT_TRUE(driver_->pgs().remove("pack"));
  auto best_effort = create("spread", 2, 1, "spread");
  EXPECT_EQ(bundle_nodes(best_effort), (std::vector<std::string>{"n1", "n2"}));
  ASSERT_TRUE(driver_->pgs().remove("spread"));
}

TEST_F(ClusterBasics, RequestsNoNodeCanHoldAreRefusedAndTheClusterKeepsServing) {
  auto too_big = driver_->pgs().create({"big", {{{"GPU", 3}}}, "pack", 5});
  ASSERT_FALSE(too_big);
  EXPECT_TRUE(is(too_big.error(), errc::infeasible)) << driver_->sys().render(too_big.error());
  auto three = driver_->pgs().create({"three", {{{"GPU", 1}}, {{"GPU", 1}}, {{"GPU", 1}}},
                                      "strict_spread", 5});
  ASSERT_FALSE(three);
  EXPECT_NE(error_message(three.error()).find("2 nodes"), std::string::npos)
    << error_message(three.error());
  auto bad = driver_->pgs().create({"nan", {{{"GPU", -1}}}, "pack", 5});
  ASSERT_FALSE(bad);
  EXPECT_TRUE(is(bad.error(), errc::invalid_argument));
  auto strategy = driver_->pgs().create({"s", {{{"GPU", 1}}}, "diagonal", 5});
  ASSERT_FALSE(strategy);
  EXPECT_NE(error_message(strategy.error()).find("diagonal"), std::string::npos);
  EXPECT_FALSE(driver_->pgs().remove("no-such-group"));
  // Still serving.
  create("after-bad-input", 1, 1, "pack");
  ASSERT_TRUE(driver_->pgs().remove("after-bad-input"));
}

TEST_F(ClusterBasics, AGroupWithRanksOnBothNodesAnswersMeshCallsAndAllReduces) {
  auto pg = create("mesh", 2, 1, "strict_spread");
  actors::group_spec spec;
  spec.name = "mesh-group";
  spec.kind = "policy";
  spec.placement = pg;
  spec.threads_per_rank = 1;
  spec.placement_manager = driver_->manager();
  spec.init_timeout = 30s;
  auto group = actors::actor_group::spawn(driver_->sys(), spec);
  ASSERT_TRUE(group) << driver_->sys().render(group.error()) << "\n" << cluster_->logs();
  auto infos = group->ranks();
  ASSERT_TRUE(infos);
  ASSERT_EQ(infos->size(), 2u);
  EXPECT_EQ((*infos)[0].node_id, "n1");
  EXPECT_EQ((*infos)[1].node_id, "n2");
  // Each rank runs in its node's process.
  auto where = group->call_all(actors::rank_ops::location.id, caf::message{}, 10s);
  ASSERT_TRUE(where) << driver_->sys().render(where.error());
  ASSERT_EQ(where->size(), 2u);
  auto pid0 = (*where)[0].get_as<int64_t>(1), pid1 = (*where)[1].get_as<int64_t>(1);
  EXPECT_EQ(pid0, cluster_->node("n1").pid());
  EXPECT_EQ(pid1, cluster_->node("n2").pid());
  // A mesh call: rank i gets chunk i.
  std::vector<caf::message> chunks{caf::make_message(tensor_list{f32_blob({1, 2})}),
                                   caf::make_message(tensor_list{f32_blob({10, 20})})};
  auto sums = group->call_mesh(actors::rank_ops::all_reduce.id, chunks, 30s);
  ASSERT_TRUE(sums) << driver_->sys().render(sums.error());
  for (auto& m : *sums)
    EXPECT_EQ(floats(m.get_as<tensor_list>(0).at(0)), (std::vector<float>{11, 22}));
  // A broadcast from rank 1 across the processes.
  auto bc = group->call_mesh(actors::rank_ops::broadcast.id,
                             {caf::make_message(tensor_list{f32_blob({0, 0})}, int32_t{1}),
                              caf::make_message(tensor_list{f32_blob({7, 8})}, int32_t{1})},
                             30s);
  ASSERT_TRUE(bc) << driver_->sys().render(bc.error());
  EXPECT_EQ(floats((*bc)[0].get_as<tensor_list>(0).at(0)), (std::vector<float>{7, 8}));
  expect_no_wildcard_listener("while a Gloo group spans the nodes");
  // Errors name the group, the rank, the op and the node.
  auto bad = group->call_all(caf::atom("no_such_op"), caf::message{}, 10s);
  ASSERT_FALSE(bad);
  auto msg = error_message(bad.error());
  EXPECT_NE(msg.find("group 'mesh-group' rank "), std::string::npos) << msg;
  EXPECT_NE(msg.find("op 'no_such_op'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(on node 'n"), std::string::npos) << msg;
  // The head lists the group with the nodes of its ranks, and the nodes count the ranks.
  auto status = driver_->status();
  bool listed = false;
  for (auto& g : status["actor_groups"])
    if (g["name"] == "mesh-group") {
      listed = true;
      EXPECT_EQ(g["rank_nodes"], nlohmann::json({"n1", "n2"}));
      EXPECT_EQ(g["state"], "alive");
    }
  EXPECT_TRUE(listed) << status.dump(2);
  EXPECT_TRUE(eventually([&] { return driver_->status(); },
                         [](const nlohmann::json& s) {
                           return node_status(s, "n1")["ranks"] == 1
                                  && node_status(s, "n2")["ranks"] == 1;
                         },
                         10s))
    << driver_->status().dump(2);
  group->stop();
  ASSERT_TRUE(driver_->pgs().remove("mesh"));
  // Stopped ranks leave the census; the record goes.
  EXPECT_TRUE(eventually([&] { return driver_->status(); },
                         [](const nlohmann::json& s) {
                           return node_status(s, "n1")["ranks"] == 0
                                  && node_status(s, "n2")["ranks"] == 0
                                  && s["actor_groups"].empty();
                         },
                         10s))
    << driver_->status().dump(2);
}

TEST_F(ClusterBasics, AGlooWeightChannelBetweenTheNodesOpensOnceForEverySync) {
  auto pg = create("sync", 2, 1, "strict_spread");
  auto bundle = [&](size_t i) {
    auto one = pg;
    one.bundles = {pg.bundles.at(i)};
    return one;
  };
  auto policy = driver_->spawn_group("sync-policy", "policy", bundle(0));
  ASSERT_TRUE(policy) << driver_->sys().render(policy.error()) << cluster_->logs();
  auto engines = driver_->spawn_group("sync-engines", "engine", bundle(1));
  ASSERT_TRUE(engines) << driver_->sys().render(engines.error()) << cluster_->logs();
  auto dispatcher = actors::spawn_dispatcher(driver_->sys());
  {
    actors::trainer_client client{driver_->sys(), dispatcher, 120s};
    auto must = [&](auto x, const char* what) {
      ASSERT_TRUE(x) << what << ": " << driver_->sys().render(x.error()) << cluster_->logs();
    };
    must(client.register_group("policy", *policy), "register policy");
    must(client.register_engines(*engines), "register engines");
    model_spec m;
    m.preset = "tiny";
    m.compute_dtype = "fp32";
    m.seed = 3;
    must(client.init_model("policy", m), "init policy");
    must(client.init_model("engines", m), "init engines");
    must(client.set_weight_transport("gloo"), "gloo");
    for (int64_t v = 1; v <= 3; ++v) {
      auto synced = client.save_weights_for_sampler("policy");
      ASSERT_TRUE(synced) << driver_->sys().render(synced.error()) << cluster_->logs();
      EXPECT_EQ(*synced, v);
    }
    expect_no_wildcard_listener("while a weight channel is open");
    auto s = client.status();
    ASSERT_TRUE(s);
    EXPECT_EQ((*s)["last_sync"]["engines/0"], "gloo") << s->dump();
    EXPECT_EQ((*s)["gloo_channels_opened"], 1) << s->dump();
    EXPECT_EQ((*s)["gloo_channels"]["policy"]["syncs"], 3) << s->dump();
  }
  caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
  policy->stop();
  engines->stop();
  ASSERT_TRUE(driver_->pgs().remove("sync"));
}

TEST_F(ClusterBasics, StatusReportsNodesTheirResourcesAndPlacementGroups) {
  auto pg = create("status-pg", 1, 0.5, "pack");
  auto status = driver_->status();
  ASSERT_TRUE(status.contains("nodes")) << status.dump(2);
  auto n1 = node_status(status, "n1"), n2 = node_status(status, "n2");
  ASSERT_FALSE(n1.is_null());
  ASSERT_FALSE(n2.is_null());
  EXPECT_TRUE(n1["alive"].get<bool>());
  EXPECT_EQ(n1["total"]["GPU"], 2.0);
  EXPECT_EQ(n1["total"]["CPU"], 4.0);
  EXPECT_EQ(n1["available"]["GPU"].get<double>() + n2["available"]["GPU"].get<double>(), 3.5);
  EXPECT_LT(n1["last_heartbeat_ms"].get<int64_t>(), 4000);
  bool found = false;
  for (auto& g : status["placement_groups"])
    if (g["name"] == "status-pg") {
      found = true;
      EXPECT_EQ(g["state"], "placed");
      EXPECT_FALSE(g["owner"].get<std::string>().empty());
    }
  EXPECT_TRUE(found) << status.dump(2);
  ASSERT_TRUE(driver_->pgs().remove("status-pg"));
  // The CLI shows the same.
  child_process cli({rlforge_binary(), "status", "--cluster", cluster_->endpoint()},
                    cluster_->dir() + "/status.log");
  ASSERT_EQ(cli.wait_exit(60s), 0) << cli.log();
  auto out = cli.log();
  EXPECT_NE(out.find("n1"), std::string::npos) << out;
  EXPECT_NE(out.find("alive"), std::string::npos) << out;
}

TEST(ClusterHead, AHeadThatDeclaresResourcesHostsRanksInItsOwnProcess) {
  test_cluster cluster{"own-node", {"--gpus", "1", "--cpus", "1", "--node-id", "headnode"}};
  ASSERT_TRUE(cluster.head().wait_for_log("with its own node 'headnode'", 30s)) << cluster.logs();
  cluster.add_node("n1", 1, 1);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error();
  auto pg = driver.pgs().create({"two", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  EXPECT_EQ(bundle_nodes(*pg), (std::vector<std::string>{"headnode", "n1"}));
  auto group = driver.spawn_group("g", "policy", *pg);
  ASSERT_TRUE(group) << driver.sys().render(group.error()) << cluster.logs();
  auto where = group->call_all(actors::rank_ops::location.id, caf::message{}, 10s);
  ASSERT_TRUE(where);
  EXPECT_EQ((*where)[0].get_as<int64_t>(1), cluster.head().pid());
  EXPECT_EQ((*where)[1].get_as<int64_t>(1), cluster.node("n1").pid());
  auto sums = group->call_mesh(actors::rank_ops::all_reduce.id,
                               {caf::make_message(tensor_list{f32_blob({1})}),
                                caf::make_message(tensor_list{f32_blob({2})})},
                               30s);
  ASSERT_TRUE(sums) << driver.sys().render(sums.error());
  EXPECT_EQ(floats((*sums)[1].get_as<tensor_list>(0).at(0)), std::vector<float>{3});
  group->stop();
}

TEST(ClusterHead, ANodeLeavesCleanlyOnSigterm) {
  test_cluster cluster{"leave"};
  auto& node = cluster.add_node("n1", 1, 1);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error();
  auto pg = driver.pgs().create({"one", {{{"GPU", 1}}}, "pack", 10});
  ASSERT_TRUE(pg);
  node.signal(SIGTERM);
  ASSERT_EQ(node.wait_exit(30s), 0) << node.log();
  EXPECT_NE(node.log().find("left the cluster"), std::string::npos) << node.log();
  auto s = driver.status();
  EXPECT_EQ(node_status(s, "n1")["alive"], false) << s.dump(2);
  EXPECT_EQ(node_status(s, "n1")["death"], "left the cluster") << s.dump(2);
  auto gone = driver.pgs().get("one");
  ASSERT_FALSE(gone);
  EXPECT_NE(error_message(gone.error()).find("node 'n1' left the cluster"), std::string::npos)
    << error_message(gone.error());
}

// `rlforge head --metrics-port 0`: Prometheus text on loopback with the nodes, their heartbeats,
// placement groups, actor groups and spawn latency; a node's death shows.
TEST(ClusterHead, ServesPrometheusMetrics) {
  test_cluster cluster{"metrics", {"--metrics-port", "0"}};
  const std::string marker = "metrics on http://";
  ASSERT_TRUE(cluster.head().wait_for_log(marker, 30s)) << cluster.logs();
  auto log = cluster.head().log();
  auto at = log.find(marker) + marker.size();
  const auto url = "http://" + log.substr(at, log.find('\n', at) - at);
  ASSERT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << url;
  cluster.add_node("n1", 1, 1);
  auto& n2 = cluster.add_node("n2", 1, 1);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error();
  auto pg = driver.pgs().create({"two", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  auto group = driver.spawn_group("g", "policy", *pg);
  ASSERT_TRUE(group) << driver.sys().render(group.error()) << cluster.logs();
  service::tinker_client http("127.0.0.1", 0, "");
  auto scrape = [&] {
    auto r = http.get_url(url);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
    auto p = rlforge::test::parse_prometheus(r.body);
    EXPECT_TRUE(p.error.empty()) << p.error << "\n" << r.body;
    return p;
  };
  // The group's announcement, and the nodes' census of their ranks (sent with heartbeats),
  // reach the head after the spawn returns.
  auto announced = [&] {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    for (;;) {
      auto p = scrape();
      if ((p.value("rlforge_actor_group_spawn_seconds_count") >= 1 &&
           p.value("rlforge_node_ranks{node=\"n1\"}") >= 1) ||
          std::chrono::steady_clock::now() > deadline)
        return p;
      std::this_thread::sleep_for(100ms);
    }
  };
  auto p = announced();
  EXPECT_EQ(p.value("rlforge_cluster_nodes{state=\"alive\"}"), 2);
  EXPECT_EQ(p.value("rlforge_cluster_nodes{state=\"dead\"}"), 0);
  EXPECT_EQ(p.value("rlforge_placement_groups{state=\"placed\"}"), 1);
  EXPECT_EQ(p.value("rlforge_actor_groups{state=\"alive\"}"), 1);
  EXPECT_EQ(p.value("rlforge_cluster_drivers"), 1);
  EXPECT_EQ(p.value("rlforge_actor_group_spawn_seconds_count"), 1);
  EXPECT_GT(p.value("rlforge_actor_group_spawn_seconds_sum"), 0);
  EXPECT_EQ(p.value("rlforge_node_ranks{node=\"n1\"}"), 1);
  const double age = p.value("rlforge_node_heartbeat_age_seconds{node=\"n1\"}");
  EXPECT_GE(age, 0);
  EXPECT_LT(age, 5);
  EXPECT_GE(p.value("rlforge_node_heartbeats_total"), 1);
  EXPECT_EQ(p.value("rlforge_node_deaths_total"), 0);
  // Anything but /metrics is a 404.
  EXPECT_EQ(http.get_url(url.substr(0, url.rfind('/')) + "/other").status, 404);
  n2.signal(SIGKILL);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (scrape().value("rlforge_node_deaths_total") < 1 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(100ms);
  p = scrape();
  EXPECT_EQ(p.value("rlforge_node_deaths_total"), 1);
  EXPECT_EQ(p.value("rlforge_cluster_nodes{state=\"dead\"}"), 1);
  EXPECT_EQ(p.value("rlforge_node_heartbeat_age_seconds{node=\"n2\"}"), -1); // dead: no series
  EXPECT_EQ(p.value("rlforge_actor_groups{state=\"failed\"}"), 1);
  group->stop();
}

// Bad metrics flags are refused by name, and the head does not start.
TEST(ClusterHead, RefusesBadMetricsFlags) {
  const std::string dir = ::testing::TempDir();
  for (const auto& [args, says] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--metrics-port", "99999"}, "--metrics-port expects an integer in 0..65535"},
           {{"--metrics-port", "x"}, "--metrics-port expects"},
           {{"--metrics-bind", "127.0.0.1"}, "--metrics-bind needs --metrics-port"}}) {
    std::vector<std::string> argv = {rlforge_binary(), "head", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    child_process head(argv, dir + "/bad-metrics.log");
    EXPECT_EQ(head.wait_exit(30s), 2) << head.log();
    EXPECT_NE(head.log().find(says), std::string::npos) << head.log();
  }
}
