// The Tinker backend (actors/dispatcher_backend.hpp) unchanged in a driver attached to a
// cluster: given a placement group on a node, its models' training groups and engines run in
// that node's process; training, sampler snapshots and sampling work as on one node.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/dispatcher_backend.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "runtime/cluster_protocol.hpp"
#include "service/tinker_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tinker/error.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
namespace tk = rlforge::tinker;

namespace {

tk::datum next_tokens(const std::vector<int64_t>& seq) {
  tk::datum d;
  d.tokens.assign(seq.begin(), seq.end() - 1);
  tk::tensor_data target;
  target.type = tk::dtype::int64;
  target.shape = {static_cast<int64_t>(seq.size() - 1)};
  target.ints.assign(seq.begin() + 1, seq.end());
  d.loss_fn_inputs["target_tokens"] = target;
  tk::tensor_data weights;
  weights.type = tk::dtype::float32;
  weights.shape = target.shape;
  weights.floats.assign(seq.size() - 1, 1.0);
  d.loss_fn_inputs["weights"] = weights;
  return d;
}

} // namespace

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
    self->request(ranks[0], 10s, call_atom::value, std::string{"location"}, caf::message{})
      .receive([&](op_result& r) { pid = r.value.get_as<int64_t>(1); }, [](caf::error&) {});
    EXPECT_EQ(pid, cluster.node("n1").pid());
    tk::forward_backward_request req;
    req.model_id = "m";
    req.loss_fn = "cross_entropy";
    req.data = {next_tokens({1, 5, 9, 13, 17, 21}), next_tokens({2, 4, 6, 8, 10})};
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
// error naming the node: no future stays pending. (With it, the service heals: below.)
TEST(ClusterService, RlforgeServeRunsItsModelsOnANodeAndNoFutureOutlivesTheNode) {
  test_cluster cluster{"serve_cli"};
  cluster.add_node("n1", 1, 2);
  served serve = start_serve(cluster, {});
  ASSERT_GT(serve.port, 0) << serve.log() << cluster.logs();
  service::tinker_client client("127.0.0.1", serve.port, "");
  tk::forward_backward_request req;
  req.loss_fn = "cross_entropy";
  req.data = {next_tokens({1, 5, 9, 13, 17, 21}), next_tokens({2, 4, 6, 8, 10})};
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

namespace {

/// One model's scripted run through HTTP: four SFT steps (forward_backward, optim_step), a
/// sampler snapshot after steps 1 and 3, and a seeded sample on each snapshot.
struct serve_script {
  explicit serve_script(const service::tinker_client& c) : client(c) {}

  const service::tinker_client& client;
  std::string model;
  int64_t seq = 0;
  int64_t sample_seq = 0;
  std::vector<double> losses;
  std::vector<std::string> samplers; ///< the snapshots' sampling session ids
  std::vector<std::vector<std::vector<int64_t>>> samples;

  static std::vector<std::vector<int64_t>> tokens(const tk::sample_response& r) {
    std::vector<std::vector<int64_t>> out;
    for (auto& q : r.sequences)
      out.push_back(q.tokens);
    return out;
  }

  /// A seeded sample on `sampler`, under a new seq_id (a repeated one would be answered with
  /// the first call's result).
  std::vector<std::vector<int64_t>> sample_on(const std::string& sampler) {
    return tokens(client.sample(sampler, ++sample_seq, {1, 5, 9}, 2, 4, /*seed=*/3));
  }

  void step(int s) {
    tk::forward_backward_request req;
    req.model_id = model;
    req.loss_fn = "cross_entropy";
    req.data = {next_tokens({1, 5, 9, 13, 17, 21}), next_tokens({2, 4, 6, 8, 10})};
    req.seq_id = ++seq;
    losses.push_back(client.forward_backward(req).metrics.at("loss:sum"));
    tk::adam_params p;
    p.learning_rate = 1e-2;
    client.optim_step(model, ++seq, p);
    if (s % 2 == 1) {
      nlohmann::json body{{"model_id", model}, {"seq_id", ++seq},
                          {"type", "save_weights_for_sampler"}};
      auto id = service::tinker_client::request_id_of(
          client.post("save_weights_for_sampler", body.dump()));
      auto answer = nlohmann::json::parse(client.wait_future(id, false).body);
      if (!answer.contains("sampling_session_id"))
        throw service::client_error(500, "test", answer.dump());
      samplers.push_back(answer["sampling_session_id"].get<std::string>());
      samples.push_back(sample_on(samplers.back()));
    }
  }
};

/// Creates models `ref` and `m` with the same LoRA seed (so the same weights) and runs ref's
/// four steps.
void twins_with_ref_trained(const service::tinker_client& client, serve_script& ref,
                            serve_script& m) {
  tk::lora_config lora;
  lora.rank = 4;
  lora.has_seed = true;
  lora.seed = 1;
  auto session = client.create_session();
  ref.model = client.create_model(session, 0, "base", lora);
  m.model = client.create_model(session, 1, "base", lora);
  for (int s = 0; s < 4; ++s)
    ref.step(s);
}

} // namespace

// `rlforge serve --cluster --max-restarts N`: the node holding the service's models gets `sig`
// (SIGKILL: it dies; SIGSTOP: it hangs until the head declares it dead) between two steps of
// model m. The next call heals: the placement group is placed on the node left, m is rebuilt from
// its recovery checkpoint and the calls since, and the call runs there. Every figure of m after
// that (loss, snapshot samples) equals that of model ref, trained identically before the loss;
// ref's snapshot older than its recovery checkpoint is refused, naming the lost node.
void serve_heals_a_lost_node(int sig) {
  test_cluster cluster{"serve_heal"};
  cluster.add_node("n1", 1, 2);
  served serve = start_serve(cluster, {"--max-restarts", "2", "--recovery-checkpoint-every", "2",
                                       "--recovery-timeout", "60"});
  ASSERT_GT(serve.port, 0) << serve.log() << cluster.logs();
  service::tinker_client client("127.0.0.1", serve.port, "");
  serve_script ref{client}, m{client};
  try {
    twins_with_ref_trained(client, ref, m);
    for (int s = 0; s < 3; ++s)
      m.step(s);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << serve.log() << cluster.logs();
  }
  cluster.add_node("n2", 1, 2); // where the models go
  cluster.node("n1").signal(sig);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    m.step(3);
    std::printf("[ figure   ] %s: the next call answered in %.2f s (healed)\n",
                sig == SIGKILL ? "SIGKILL" : "SIGSTOP",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_EQ(m.losses, ref.losses);
    EXPECT_EQ(m.samples, ref.samples);
    // m's first snapshot was in its journal: saved again, it samples as before.
    EXPECT_EQ(m.sample_on(m.samplers.at(0)), ref.samples.at(0));
    EXPECT_EQ(ref.sample_on(ref.samplers.at(1)), ref.samples.at(1));
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << serve.log() << cluster.logs();
  }
  // ref's first snapshot is older than ref's last recovery checkpoint: lost with n1.
  try {
    ref.sample_on(ref.samplers.at(0));
    ADD_FAILURE() << "a snapshot lost with its node was sampled";
  } catch (const service::client_error& e) {
    EXPECT_NE(std::string{e.what()}.find("were lost with node 'n1'"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(serve.log().find("placement_replaced"), std::string::npos) << serve.log();
  // One recovery, two models rebuilt (m by its training call, ref by its sample).
  auto metrics = client.get_url("http://127.0.0.1:" + std::to_string(serve.port) + "/metrics").body;
  EXPECT_NE(metrics.find("\nrlforge_recoveries_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nrlforge_models_rebuilt_total 2\n"), std::string::npos) << metrics;
  test_driver observer{cluster.endpoint()};
  ASSERT_TRUE(observer.error().empty()) << observer.error();
  auto s = observer.status();
  EXPECT_FALSE(s["actor_groups"].empty()) << s.dump(2);
  for (auto& g : s["actor_groups"])
    EXPECT_EQ(g["rank_nodes"], nlohmann::json::array({"n2"})) << s.dump(2);
  serve.kill();
}

TEST(ClusterService, RlforgeServeHealsAModelWhoseNodeDiesAndItsFiguresEqualAnUninterruptedRun) {
  serve_heals_a_lost_node(SIGKILL);
}

TEST(ClusterService, RlforgeServeHealsAModelWhoseNodeHangsAndItsFiguresEqualAnUninterruptedRun) {
  serve_heals_a_lost_node(SIGSTOP);
}

// `rlforge serve --cluster --max-restarts N` whose only node dies: no node has room, and the
// call's future fails at --recovery-timeout naming it and the loss; it never hangs.
TEST(ClusterService, RlforgeServeWithNoNodeLeftFailsTheCallAtTheRecoveryTimeout) {
  test_cluster cluster{"serve_no_room"};
  cluster.add_node("n1", 1, 2);
  served serve = start_serve(cluster, {"--max-restarts", "3", "--recovery-timeout", "2"});
  ASSERT_GT(serve.port, 0) << serve.log() << cluster.logs();
  service::tinker_client client("127.0.0.1", serve.port, "");
  serve_script m{client};
  try {
    m.model = client.create_model(client.create_session(), 0, "base", {});
    m.step(0);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << serve.log() << cluster.logs();
  }
  cluster.node("n1").signal(SIGKILL);
  try {
    m.step(1);
    ADD_FAILURE() << "a call succeeded with no node left";
  } catch (const service::client_error& e) {
    EXPECT_NE(e.status(), 408) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("a rank on node 'n1' was lost and no node had room for the service's "
                        "placement group 'rlforge-serve' within 2000 ms (--recovery-timeout)"),
              std::string::npos)
        << what;
  }
  serve.kill();
}

// `rlforge serve --cluster --max-restarts N` through a head restart (`rlforge head --state`):
// training goes on while the head is away (calls go to the node, not the head), the service's
// session attaches to the restarted head, and a node lost after that heals through the new head,
// with the same figures as an uninterrupted model.
TEST(ClusterService, RlforgeServeGoesOnThroughAHeadRestartAndHealsThroughTheNewHead) {
  const std::string state =
      ::testing::TempDir() + "/serve_head_restart_" + std::to_string(::getpid()) + ".db";
  std::filesystem::remove(state);
  test_cluster cluster{"serve_head", {"--state", state}};
  cluster.add_node("n1", 1, 2);
  served serve =
      start_serve(cluster, {"--max-restarts", "1", "--recovery-checkpoint-every", "2"});
  ASSERT_GT(serve.port, 0) << serve.log() << cluster.logs();
  service::tinker_client client("127.0.0.1", serve.port, "");
  serve_script ref{client}, m{client};
  try {
    twins_with_ref_trained(client, ref, m);
    m.step(0);
    m.step(1);
    cluster.head().kill();
    m.step(2); // the head is away: the model's node trains on
    cluster.restart_head();
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << serve.log() << cluster.logs();
  }
  ASSERT_TRUE(cluster.head().wait_for_log("driver_attached_again", 60s))
      << cluster.logs() << serve.log();
  cluster.add_node("n2", 1, 2);
  cluster.node("n1").signal(SIGKILL);
  try {
    m.step(3);
    EXPECT_EQ(m.losses, ref.losses);
    EXPECT_EQ(m.samples, ref.samples);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << serve.log() << cluster.logs();
  }
  EXPECT_NE(serve.log().find("new_node=n2"), std::string::npos) << serve.log();
  serve.kill();
  std::filesystem::remove(state);
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
