// How a driver (the GRPO job, placement split: the policy and the reference on one node, the
// engines on the other) ends when a process of its cluster fails: it exits with status 1 and an
// error naming what was lost, within a bound, on every exit path. A hung engines' node fails
// the call waiting on it as soon as the node is declared dead (not at the call's deadline); a
// hung trainer's node, repeated, never ends the driver in a crash at exit; a killed head is
// named as the cause; SIGINT stops the job's actors and ends the driver with 130.
#include <gtest/gtest.h>

#include <signal.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge::cluster_test;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// A short warm start: these tests need GRPO under way, not a policy that learns.
std::vector<std::string> job(test_cluster& cluster, const std::string& tag) {
  return grpo_split_job(cluster, tag, {"--steps", "40", "--held-out", "20", "--sft-steps", "40"});
}

/// Waits for the job's opening line; the node the policy is on and the engines' node.
std::pair<std::string, std::string> wait_for_layout(child_process& job) {
  if (!job.wait_for_log("engines (1) on node '", 120s))
    return {};
  auto out = job.log();
  return {quoted_after(out, "and ref (1) on node '"), quoted_after(out, "engines (1) on node '")};
}

/// A head, nodes n1 and n2, and the GRPO job on them, started: `layout` is (the policy's node,
/// the engines' node), empty when the job never printed its opening line.
struct job_on_two_nodes {
  /// `node_args` go to both nodes.
  explicit job_on_two_nodes(const std::string& tag, std::vector<std::string> node_args = {})
    : cluster{tag} {
    cluster.add_node("n1", 1, 2, node_args);
    cluster.add_node("n2", 1, 2, node_args);
    grpo = std::make_unique<child_process>(job(cluster, "job"), cluster.dir() + "/job.log",
                                           passive_omp);
    layout = wait_for_layout(*grpo);
  }

  test_cluster cluster;
  std::unique_ptr<child_process> grpo; ///< stopped (by its pid) before the cluster
  std::pair<std::string, std::string> layout;
};

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

} // namespace

TEST(ClusterDriverExits, AHungEnginesNodeFailsTheJobOnceItIsDeclaredDead) {
  job_on_two_nodes run{"hung_engines"};
  auto& cluster = run.cluster;
  auto& grpo = *run.grpo;
  const auto engine_node = run.layout.second;
  ASSERT_FALSE(engine_node.empty()) << grpo.log() << cluster.logs();
  // GRPO is under way (steps alternate generation, training and weight syncs).
  for (int i = 0; i < 1200 && read_jsonl(cluster.dir() + "/job.jsonl").size() < 2 && grpo.running();
       ++i)
    std::this_thread::sleep_for(100ms);
  ASSERT_GE(read_jsonl(cluster.dir() + "/job.jsonl").size(), 2u) << grpo.log() << cluster.logs();
  auto stopped = clock_type::now();
  cluster.node(engine_node).signal(SIGSTOP);
  // Declared dead in about a second; every wait on the engines ends then, not at the job's
  // 300 s call deadline.
  auto rc = grpo.wait_exit(60s);
  cluster.node(engine_node).signal(SIGCONT);
  ASSERT_TRUE(rc.has_value()) << "the job hangs on its hung engines\n" << grpo.log();
  std::printf("[ figure   ] the job ended %.1f s after its engines' node stopped\n",
              seconds_since(stopped));
  EXPECT_EQ(*rc, 1) << grpo.log();
  auto out = grpo.log();
  EXPECT_NE(out.find("role 'engines'"), std::string::npos) << out;
  EXPECT_NE(out.find("rlforge.rank_failed"), std::string::npos) << out;
}

TEST(ClusterDriverExits, ADriverWhoseTrainerNodeHangsExitsCleanlyEveryTime) {
  // A crash at exit came 1 run in 5: an actor still running during static destruction. Twenty
  // runs, each on two fresh nodes, each ending with status 1 and the failure named.
  test_cluster cluster{"hung_trainer"};
  for (int run = 0; run < 20; ++run) {
    const auto a = "a" + std::to_string(run), b = "b" + std::to_string(run);
    cluster.add_node(a, 1, 2);
    cluster.add_node(b, 1, 2);
    {
      child_process grpo(job(cluster, "run" + std::to_string(run)),
                         cluster.dir() + "/run" + std::to_string(run) + ".log", passive_omp);
      auto [policy_node, engine_node] = wait_for_layout(grpo);
      ASSERT_FALSE(policy_node.empty()) << "run " << run << "\n" << grpo.log() << cluster.logs();
      cluster.node(policy_node).signal(SIGSTOP);
      auto rc = grpo.wait_exit(60s);
      ASSERT_TRUE(rc.has_value()) << "run " << run << " hangs\n" << grpo.log();
      EXPECT_EQ(*rc, 1) << "run " << run << " (-1: ended by a signal)\n" << grpo.log();
      EXPECT_NE(grpo.log().find("failed: rlforge.rank_failed"), std::string::npos) << grpo.log();
    }
    cluster.drop_node(a);
    cluster.drop_node(b);
  }
}

TEST(ClusterDriverExits, AKilledHeadIsNamedAsTheCause) {
  // Nodes without a head grace stop the job's ranks as soon as the head is gone.
  job_on_two_nodes run{"killed_head", {"--head-grace-ms", "0"}};
  auto& cluster = run.cluster;
  auto& grpo = *run.grpo;
  ASSERT_FALSE(run.layout.first.empty()) << grpo.log() << cluster.logs();
  cluster.head().kill();
  auto rc = grpo.wait_exit(60s);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 1) << grpo.log();
  EXPECT_NE(grpo.log().find("the cluster head at " + cluster.endpoint() + " is lost"),
            std::string::npos)
      << grpo.log();
}

TEST(ClusterDriverExits, AnInterruptedDriverStopsItsJobAndEndsWith130) {
  job_on_two_nodes run{"interrupted"};
  auto& cluster = run.cluster;
  auto& grpo = *run.grpo;
  ASSERT_FALSE(run.layout.first.empty()) << grpo.log() << cluster.logs();
  grpo.signal(SIGINT);
  auto rc = grpo.wait_exit(30s);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 128 + SIGINT) << grpo.log();
  EXPECT_NE(grpo.log().find("Interrupt: stopping the job"), std::string::npos) << grpo.log();
  // The head freed the job's placement groups and its nodes' resources.
  test_driver observer{cluster.endpoint()};
  ASSERT_TRUE(observer.error().empty()) << observer.error();
  EXPECT_TRUE(eventually([&] { return observer.status(); },
                         [](const nlohmann::json& s) {
                           if (!s["placement_groups"].empty())
                             return false;
                           for (auto& n : s["nodes"])
                             if (n["available"]["GPU"] != n["total"]["GPU"])
                               return false;
                           return true;
                         },
                         10s))
      << observer.status().dump(2);
}
