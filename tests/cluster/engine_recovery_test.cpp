// The GRPO job recovering from the loss of its engines' node in place (--max-restarts,
// placement split): the node is SIGKILLed (fully async, rollouts in flight) or hung by SIGSTOP
// (sync); new engines are placed on a node left, synced, given the lost rollouts, and the run
// finishes with every step's samples, recording the recovery. With no room left the job fails
// at --recovery-timeout, naming it.
#include <gtest/gtest.h>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

constexpr int steps = 10, prompts = 16, group = 4;

std::vector<std::string> job(test_cluster& cluster, std::vector<std::string> extra) {
  std::vector<std::string> args{"--steps",     std::to_string(steps),
                                "--prompts",   std::to_string(prompts),
                                "--group",     std::to_string(group),
                                "--sft-steps", "40",
                                "--held-out",  "20"};
  args.insert(args.end(), extra.begin(), extra.end());
  return grpo_split_job(cluster, "job", args);
}

/// Starts the job, waits for its third step record (polling every 5 ms: the next step starts
/// with its generation), sends `sig` to the engines' node; that node.
std::string lose_engines_after_step_3(test_cluster& cluster, child_process& grpo, int sig) {
  if (!grpo.wait_for_log("engines (1) on node '", 120s))
    return {};
  auto node = quoted_after(grpo.log(), "engines (1) on node '");
  for (int i = 0;
       i < 24000 && read_jsonl(cluster.dir() + "/job.jsonl").size() < 3 && grpo.running(); ++i)
    std::this_thread::sleep_for(5ms);
  cluster.node(node).signal(sig);
  return node;
}

/// The run finished with every step's samples and one recovery away from `lost`; returns the
/// rollouts that recovery generated again.
int expect_healed_run(test_cluster& cluster, child_process& grpo, const std::string& lost) {
  auto rc = grpo.wait_exit(180s);
  EXPECT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(rc.value_or(-2), 0) << grpo.log() << cluster.logs();
  auto rs = read_jsonl(cluster.dir() + "/job.jsonl");
  EXPECT_EQ(rs.size(), static_cast<size_t>(steps)) << grpo.log();
  int recoveries = 0, regenerated = 0;
  for (auto& r : rs) {
    // No sample lost: every step trained on all its rollouts' samples.
    EXPECT_EQ(r["samples"], prompts * group) << r.dump();
    if (r.contains("recoveries"))
      for (auto& rec : r["recoveries"]) {
        ++recoveries;
        regenerated += rec["regenerated"].get<int>();
        EXPECT_NE(rec["engines_node"], lost) << rec.dump();
        EXPECT_EQ(rec["steps_replayed"], 0) << rec.dump();
        std::printf("[ figure   ] engines replaced on '%s' %.3f s after the loss was seen; "
                    "%d rollouts generated again\n",
                    rec["engines_node"].get<std::string>().c_str(), rec["seconds"].get<double>(),
                    rec["regenerated"].get<int>());
      }
  }
  EXPECT_EQ(recoveries, 1) << grpo.log();
  EXPECT_NE(grpo.log().find("grpo: ok"), std::string::npos) << grpo.log();
  return regenerated;
}

} // namespace

/// Head + 3 nodes, the job with --max-restarts 1 and `extra`; its engines' node gets `sig`
/// after step 3; the rollouts the recovery generated again.
int heal(const std::string& tag, int sig, std::vector<std::string> extra) {
  test_cluster cluster{tag};
  for (auto id : {"n1", "n2", "n3"})
    cluster.add_node(id, 1, 2);
  extra.insert(extra.begin(), {"--max-restarts", "1"});
  child_process grpo(job(cluster, extra), cluster.dir() + "/job.log", passive_omp);
  auto lost = lose_engines_after_step_3(cluster, grpo, sig);
  EXPECT_FALSE(lost.empty()) << grpo.log() << cluster.logs();
  if (lost.empty())
    return -1;
  auto regenerated = expect_healed_run(cluster, grpo, lost);
  cluster.node(lost).signal(SIGCONT);
  return regenerated;
}

TEST(ClusterEngineRecovery, AKilledEnginesNodeIsReplacedAndNoRolloutIsLost) {
  // One step off: while a step trains, the next one's rollouts are generated, so the engines
  // always hold some when they are lost; they are generated again on the new engines.
  EXPECT_GE(heal("heal_kill", SIGKILL, {"--mode", "one_step_off"}), 1);
  // Fully async: finished and unfinished rollouts of several versions.
  heal("heal_kill_async", SIGKILL, {"--mode", "fully_async", "--max-staleness", "2"});
}

TEST(ClusterEngineRecovery, AHungEnginesNodeIsReplacedOnceDeclaredDead) {
  // Sync mode; the stop usually lands in the step's generation.
  heal("heal_stop", SIGSTOP, {});
}

TEST(ClusterEngineRecovery, WithNoRoomLeftTheJobFailsAtTheRecoveryTimeout) {
  test_cluster cluster{"heal_no_room"};
  cluster.add_node("n1", 1, 2);
  cluster.add_node("n2", 1, 2);
  child_process grpo(job(cluster, {"--max-restarts", "1", "--recovery-timeout", "3"}),
                     cluster.dir() + "/job.log", passive_omp);
  auto lost = lose_engines_after_step_3(cluster, grpo, SIGKILL);
  ASSERT_FALSE(lost.empty()) << grpo.log() << cluster.logs();
  auto rc = grpo.wait_exit(60s);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 1) << grpo.log();
  EXPECT_NE(grpo.log().find("no engines within 3 s (--recovery-timeout)"), std::string::npos)
      << grpo.log();
}
