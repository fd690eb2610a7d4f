// The Tinker backend (actors/dispatcher_backend.hpp) unchanged in a driver attached to a
// cluster: given a placement group on a node, its models' training groups and engines run in
// that node's process; training, sampler snapshots and sampling work as on one node.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstdlib>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/dispatcher_backend.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "runtime/cluster_protocol.hpp"
#include "service/tinker_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/tinker_datums.hpp"
#include "tinker/error.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
namespace tk = rlforge::tinker;


TEST(ClusterService, TheTinkerBackendTrainsAndSamplesOnANode) {
  test_cluster cluster{"service"};
  cluster.add_node("n1", 1, 2);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error() << cluster.logs();
  auto base = cluster.dir() + "/tiny-base";
  backends::causal_lm::random(backends::preset("tiny"), 7)->save_hf(base);
  auto pg = driver.pgs().create({"tinker", {{{"CPU", 1}}}, "pack", 10});
  ASSERT_TRUE(pg) << driver.sys().render(pg.error());
  actors::dispatcher_backend_options o;
  o.base_model_dir = base;
  o.placement = *pg;
  o.placement_manager = driver.manager();
  o.timeout = 60s;
  try {
    actors::dispatcher_backend backend{driver.sys(), o};
    tk::lora_config lora;
    lora.rank = 4;
    lora.has_seed = true;
    lora.seed = 1;
    backend.create_model("m", lora, tk::model_role::policy);
    // The model's rank runs in the node's process.
    auto ranks = backend.model_ranks("m");
    ASSERT_EQ(ranks.size(), 1u);
    caf::scoped_actor self{driver.sys()};
    int64_t pid = 0;
    self->request(ranks[0], 10s, actors::rank_ops::location.call())
        .receive([&](op_result& r) { pid = r.value.get_as<int64_t>(1); }, [](caf::error&) {});
    EXPECT_EQ(pid, cluster.node("n1").pid());
    tk::forward_backward_request req;
    req.model_id = "m";
    req.loss_fn = "cross_entropy";
    req.data = {sft_datum({1, 5, 9, 13, 17, 21}), sft_datum({2, 4, 6, 8, 10})};
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      auto out = backend.forward_backward({req});
      losses.push_back(out.at(0).metrics.at("loss:sum"));
      tk::adam_params p;
      p.learning_rate = 1e-2;
      backend.optim_step("m", p);
    }
    EXPECT_LT(losses.back(), losses.front());
    auto version = backend.save_sampler_snapshot("m");
    tk::sample_request sr;
    sr.prompt = {1, 5, 9};
    sr.num_samples = 2;
    sr.params.max_tokens = 4;
    sr.params.has_seed = true;
    sr.params.seed = 3;
    sr.sampler.type = tk::sampler_ref::kind::snapshot;
    sr.sampler.model_id = "m";
    sr.sampler.version = version;
    sr.sampler.name = "snapshot";
    auto out = backend.sample({sr});
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].sequences.size(), 2u);
    EXPECT_EQ(out[0].sequences[0].tokens.size(), out[0].sequences[0].logprobs.size());
    backend.delete_model("m");
  } catch (const tk::request_error& e) {
    FAIL() << e.what() << "\n" << cluster.logs();
  }
  // Everything the backend spawned is gone from the node.
  EXPECT_TRUE(eventually([&] { return driver.status(); },
                         [](const nlohmann::json& s) {
                           return node_status(s, "n1")["ranks"] == 0;
                         },
                         10s))
    << driver.status().dump(2);
}


// `rlforge serve --cluster`: the service attaches to the cluster as a driver and its models'
// ranks run on a node (placement group "rlforge-serve"); training through HTTP works as on one
// machine. Without --max-restarts, when that node dies the next call's future fails with an
// error naming the node: no future stays pending. (With it, the service heals:
// service_healing_test.cpp.)
TEST(ClusterService, RlforgeServeRunsItsModelsOnANodeAndNoFutureOutlivesTheNode) {
  test_cluster cluster{"serve_cli"};
  cluster.add_node("n1", 1, 2);
  served serve = start_serve(cluster, {});
  ASSERT_GT(serve.port, 0) << serve.log() << cluster.logs();
  service::tinker_client client("127.0.0.1", serve.port, "");
  tk::forward_backward_request req;
  req.loss_fn = "cross_entropy";
  req.data = {sft_datum({1, 5, 9, 13, 17, 21}), sft_datum({2, 4, 6, 8, 10})};
  try {
    auto session = client.create_session();
    tk::lora_config lora;
    lora.rank = 4;
    req.model_id = client.create_model(session, 0, "base", lora);
    req.seq_id = 1;
    auto out = client.forward_backward(req);
    EXPECT_EQ(out.loss_fn_outputs.size(), 2u);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << serve.log() << cluster.logs();
  }
  // The service's placement group and its model's group are on the node.
  test_driver observer{cluster.endpoint()};
  ASSERT_TRUE(observer.error().empty()) << observer.error();
  auto s = observer.status();
  bool placed = false;
  for (auto& g : s["placement_groups"])
    placed = placed || (g["name"] == "rlforge-serve" && g["state"] == "placed");
  EXPECT_TRUE(placed) << s.dump(2);
  EXPECT_FALSE(s["actor_groups"].empty()) << s.dump(2);
  for (auto& g : s["actor_groups"])
    EXPECT_EQ(g["rank_nodes"], nlohmann::json::array({"n1"})) << s.dump(2);

  cluster.node("n1").signal(SIGKILL);
  req.seq_id = 2;
  try {
    client.forward_backward(req);
    ADD_FAILURE() << "a call on a dead node succeeded";
  } catch (const service::client_error& e) {
    // A failed future (or a refusal), not a timeout of the client's wait.
    EXPECT_NE(e.status(), 408) << e.what();
    EXPECT_NE(std::string{e.what()}.find("n1"), std::string::npos) << e.what();
    std::printf("[ said     ] %s\n", e.what());
  }
  serve.kill();
}

// `rlforge serve --cluster` with a cluster it cannot use ends at once, naming what was wrong:
// a value that is not HOST:PORT, and a port where no head listens.
TEST(ClusterService, RlforgeServeRefusesAClusterItCannotReach) {
  const std::string dir = ::testing::TempDir();
  const auto base = dir + "/serve_bad_cluster_base";
  backends::causal_lm::random(backends::preset("tiny"), 7)->save_hf(base);
  for (const auto& [cluster, says] : std::vector<std::pair<std::string, std::string>>{
           {"nohost", "'nohost' is not HOST:PORT"},
           {"127.0.0.1:1", "cannot connect to the cluster head at 127.0.0.1:1"}}) {
    child_process serve({rlforge_binary(), "serve", "--base-model", base, "--port", "0", "--db",
                         dir + "/serve_bad_cluster.db", "--insecure-no-auth", "--cluster",
                         cluster},
                        dir + "/serve_bad_cluster.log", passive_omp);
    auto rc = serve.wait_exit(60s);
    ASSERT_TRUE(rc.has_value()) << serve.log();
    EXPECT_NE(*rc, 0) << serve.log();
    EXPECT_NE(serve.log().find(says), std::string::npos) << serve.log();
  }
}
