// `rlforge serve --cluster --max-restarts N` heals a lost node (actors/tinker_healing.hpp), tried
// over HTTP as a client would: the node of the service's models killed or hung between two
// steps, a loss seen by two clients at once, no node left, and a head restart before the loss.
// Each healed model's figures (losses, seeded samples of its snapshots) equal those of a twin
// model trained identically before the loss.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "service/tinker_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/tinker_datums.hpp"
#include "tinker/types.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
namespace tk = rlforge::tinker;

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
    req.data = {sft_datum({1, 5, 9, 13, 17, 21}), sft_datum({2, 4, 6, 8, 10})};
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

/// Creates models `ref` and `m` with the same LoRA seed `seed` (so the same weights) and runs
/// ref's four steps.
void twins_with_ref_trained(const service::tinker_client& client, serve_script& ref,
                            serve_script& m, int64_t seed = 1) {
  tk::lora_config lora;
  lora.rank = 4;
  lora.has_seed = true;
  lora.seed = seed;
  auto session = client.create_session();
  ref.model = client.create_model(session, 0, "base", lora);
  m.model = client.create_model(session, 1, "base", lora);
  for (int s = 0; s < 4; ++s)
    ref.step(s);
}

const std::vector<std::string> heal_flags{"--max-restarts", "2", "--recovery-checkpoint-every",
                                          "2", "--recovery-timeout", "60"};

} // namespace

/// A head (with `head_args`), node n1 and `rlforge serve --cluster` with `flags` on them, and a
/// client of the service. Everything is stopped by the fixture's members' destructors.
class ClusterServiceHealing : public ::testing::Test {
public: // heals_a_lost_node, shared by two tests, uses it too
  void start(const std::string& tag, const std::vector<std::string>& flags,
             std::vector<std::string> head_args = {}) {
    cluster_ = std::make_unique<test_cluster>(tag, std::move(head_args));
    cluster_->add_node("n1", 1, 2);
    serve_ = start_serve(*cluster_, flags);
    ASSERT_GT(serve_.port, 0) << serve_.log() << cluster_->logs();
    client_ = std::make_unique<service::tinker_client>("127.0.0.1", serve_.port, "");
  }

  /// Every log, for failure messages.
  std::string logs() const { return serve_.log() + cluster_->logs(); }

  /// The service's /metrics text.
  std::string metrics() const {
    return client_->get_url("http://127.0.0.1:" + std::to_string(serve_.port) + "/metrics").body;
  }

  test_cluster& cluster() { return *cluster_; }
  const service::tinker_client& client() const { return *client_; }

  std::unique_ptr<test_cluster> cluster_;
  served serve_;
  std::unique_ptr<service::tinker_client> client_;
};

// `rlforge serve --cluster --max-restarts N`: the node holding the service's models gets `sig`
// (SIGKILL: it dies; SIGSTOP: it hangs until the head declares it dead) between two steps of
// model m. The next call heals: the placement group is placed on the node left, m is rebuilt from
// its recovery checkpoint and the calls since, and the call runs there. Every figure of m after
// that (loss, snapshot samples) equals that of model ref, trained identically before the loss;
// ref's snapshot older than its recovery checkpoint is refused, naming the lost node.
void heals_a_lost_node(ClusterServiceHealing& t, int sig) {
  auto& cluster = t.cluster();
  auto& client = t.client();
  serve_script ref{client}, m{client};
  try {
    twins_with_ref_trained(client, ref, m);
    for (int s = 0; s < 3; ++s)
      m.step(s);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << t.logs();
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
    FAIL() << e.what() << "\n" << t.logs();
  }
  // ref's first snapshot is older than ref's last recovery checkpoint: lost with n1.
  try {
    ref.sample_on(ref.samplers.at(0));
    ADD_FAILURE() << "a snapshot lost with its node was sampled";
  } catch (const service::client_error& e) {
    EXPECT_NE(std::string{e.what()}.find("were lost with node 'n1'"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(t.serve_.log().find("placement_replaced"), std::string::npos) << t.logs();
  // One recovery, two models rebuilt (m by its training call, ref by its sample).
  const auto metrics = t.metrics();
  EXPECT_NE(metrics.find("\nrlforge_recoveries_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nrlforge_models_rebuilt_total 2\n"), std::string::npos) << metrics;
  test_driver observer{cluster.endpoint()};
  ASSERT_TRUE(observer.error().empty()) << observer.error();
  auto s = observer.status();
  EXPECT_FALSE(s["actor_groups"].empty()) << s.dump(2);
  for (auto& g : s["actor_groups"])
    EXPECT_EQ(g["rank_nodes"], nlohmann::json::array({"n2"})) << s.dump(2);
}

TEST_F(ClusterServiceHealing, AModelWhoseNodeDiesIsRebuiltAndItsFiguresEqualAnUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(start("serve_heal", heal_flags));
  heals_a_lost_node(*this, SIGKILL);
}

TEST_F(ClusterServiceHealing, AModelWhoseNodeHangsIsRebuiltAndItsFiguresEqualAnUninterruptedRun) {
  ASSERT_NO_FATAL_FAILURE(start("serve_heal", heal_flags));
  heals_a_lost_node(*this, SIGSTOP);
}

// Two clients train two models at once (`--workers 2`) when their node is SIGKILLed: both next
// calls see the one loss, it is healed once (one recovery on /metrics), each model is rebuilt,
// and each one's figures equal its own reference model's, trained alone before the loss.
TEST_F(ClusterServiceHealing, OneLossSeenByTwoClientsAtOnceIsHealedOnce) {
  ASSERT_NO_FATAL_FAILURE(start("serve_heal_two", {"--workers", "2", "--max-restarts", "2",
                                                   "--recovery-checkpoint-every", "2"}));
  auto& cluster = *cluster_;
  auto& client = *client_;
  serve_script ref_a{client}, a{client}, ref_b{client}, b{client};
  try {
    twins_with_ref_trained(client, ref_a, a, 1);
    twins_with_ref_trained(client, ref_b, b, 2);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << logs();
  }
  // Each client: three steps, then (once both are there) the node dies, then the fourth.
  std::mutex mutex;
  std::condition_variable cv;
  int ready = 0;
  bool killed = false;
  auto client_run = [&](serve_script& m) {
    for (int s = 0; s < 3; ++s)
      m.step(s);
    std::unique_lock<std::mutex> lock(mutex);
    ++ready;
    cv.notify_all();
    cv.wait(lock, [&] { return killed; });
    lock.unlock();
    m.step(3);
  };
  std::string failure;
  auto guarded = [&](serve_script& m) {
    try {
      client_run(m);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> guard(mutex);
      failure += std::string{e.what()} + "\n";
      killed = true; // never leave the other client waiting
      ready = 2;
      cv.notify_all();
    }
  };
  std::thread ta([&] { guarded(a); });
  std::thread tb([&] { guarded(b); });
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return ready == 2; });
  }
  cluster.add_node("n2", 1, 2);
  cluster.node("n1").signal(SIGKILL);
  {
    std::lock_guard<std::mutex> guard(mutex);
    killed = true;
  }
  cv.notify_all();
  ta.join();
  tb.join();
  ASSERT_TRUE(failure.empty()) << failure << logs();
  EXPECT_EQ(a.losses, ref_a.losses);
  EXPECT_EQ(a.samples, ref_a.samples);
  EXPECT_EQ(b.losses, ref_b.losses);
  EXPECT_EQ(b.samples, ref_b.samples);
  EXPECT_NE(a.losses, b.losses); // two different models
  const auto metrics = this->metrics();
  EXPECT_NE(metrics.find("\nrlforge_recoveries_total 1\n"), std::string::npos) << metrics;
}

// `rlforge serve --cluster --max-restarts N` whose only node dies: no node has room, and the
// call's future fails at --recovery-timeout naming it and the loss; it never hangs.
TEST_F(ClusterServiceHealing, WithNoNodeLeftTheCallFailsAtTheRecoveryTimeout) {
  ASSERT_NO_FATAL_FAILURE(
      start("serve_no_room", {"--max-restarts", "3", "--recovery-timeout", "2"}));
  auto& cluster = *cluster_;
  auto& client = *client_;
  serve_script m{client};
  try {
    m.model = client.create_model(client.create_session(), 0, "base", {});
    m.step(0);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << logs();
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
}

// `rlforge serve --cluster --max-restarts N` through a head restart (`rlforge head --state`):
// training goes on while the head is away (calls go to the node, not the head), the service's
// session attaches to the restarted head, and a node lost after that heals through the new head,
// with the same figures as an uninterrupted model.
TEST_F(ClusterServiceHealing, TrainingGoesOnThroughAHeadRestartAndHealsThroughTheNewHead) {
  const std::string state =
      ::testing::TempDir() + "/serve_head_restart_" + std::to_string(::getpid()) + ".db";
  std::filesystem::remove(state);
  ASSERT_NO_FATAL_FAILURE(start("serve_head", {"--max-restarts", "1",
                                               "--recovery-checkpoint-every", "2"},
                                {"--state", state}));
  auto& cluster = *cluster_;
  auto& client = *client_;
  serve_script ref{client}, m{client};
  try {
    twins_with_ref_trained(client, ref, m);
    m.step(0);
    m.step(1);
    cluster.head().kill();
    m.step(2); // the head is away: the model's node trains on
    cluster.restart_head();
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << logs();
  }
  ASSERT_TRUE(cluster.head().wait_for_log("driver_attached_again", 60s))
      << logs();
  cluster.add_node("n2", 1, 2);
  cluster.node("n1").signal(SIGKILL);
  try {
    m.step(3);
    EXPECT_EQ(m.losses, ref.losses);
    EXPECT_EQ(m.samples, ref.samples);
  } catch (const service::client_error& e) {
    FAIL() << e.what() << "\n" << logs();
  }
  EXPECT_NE(serve_.log().find("new_node=n2"), std::string::npos) << logs();
  std::filesystem::remove(state);
}

