// The GRPO job (examples/grpo, placement "split") on two node processes: the policy and the
// reference model on one node, the engines on the other, so every weight sync leaves the
// process. Run with the same seed on one node (embedded) and on the cluster, the rewards and
// losses agree step for step. What the job learns is not judged here (--no-goal): it depends on
// the CPU's kernels and the compute dtype; the main job and the benches keep the learning goal.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> job(const std::string& dir, const std::string& tag) {
  return {grpo_example_binary(), "--placement", "split", "--steps", "20", "--held-out", "50",
          "--no-goal", "--quiet", "--metrics", dir + "/" + tag + ".jsonl",
          "--plot", dir + "/" + tag + ".png"};
}

/// Two node processes of one GPU each: a placement group of one 1-GPU bundle per node.
void add_two_nodes(test_cluster& cluster) {
  cluster.add_node("n1", 1, 2);
  cluster.add_node("n2", 1, 2);
}

/// The job's opening line puts the policy and the engines on different nodes.
void expect_trainer_and_engines_apart(const std::string& out) {
  auto policy_node = word_after(out, "and ref (1) on node '");
  auto engine_node = word_after(out, "engines (1) on node '");
  EXPECT_FALSE(policy_node.empty()) << out;
  EXPECT_NE(policy_node, engine_node) << out;
}

} // namespace

TEST(ClusterGrpo, PolicyAndEnginesOnTwoNodesTrainAsOnOneNode) {
  test_cluster cluster{"grpo"};
  add_two_nodes(cluster);
  child_process local(job(cluster.dir(), "local"), cluster.dir() + "/local.log", passive_omp);
  ASSERT_EQ(local.wait_exit(240s), 0) << local.log();
  auto cluster_args = job(cluster.dir(), "cluster");
  cluster_args.insert(cluster_args.end(), {"--cluster", cluster.endpoint()});
  child_process remote(cluster_args, cluster.dir() + "/cluster.log", passive_omp);
  ASSERT_EQ(remote.wait_exit(240s), 0) << remote.log() << cluster.logs();
  auto out = remote.log();
  // Training on one node, generation on the other: the weights went between processes.
  expect_trainer_and_engines_apart(out);
  EXPECT_NE(out.find("weight sync transports: engines/0=shm"), std::string::npos) << out;
  EXPECT_NE(local.log().find("engines/0=in_process"), std::string::npos) << local.log();
  // The same job step for step.
  auto a = read_jsonl(cluster.dir() + "/local.jsonl");
  auto b = read_jsonl(cluster.dir() + "/cluster.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["reward"], b[i]["reward"]) << "step " << i + 1;
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-6) << "step " << i + 1;
  }
  EXPECT_NE(out.find("grpo: ok"), std::string::npos) << out;
}

TEST(ClusterGrpo, FullyAsyncRunsWithTheTrainerAndTheEnginesOnDifferentNodes) {
  // The RL loop's producer, the engines and the trainer talk only through actors: the same
  // fully_async job runs with the engines on one node process and the trainer on another.
  test_cluster cluster{"grpo_async"};
  add_two_nodes(cluster);
  std::vector<std::string> args{grpo_example_binary(), "--quick", "--quiet", "--placement",
                                "split", "--mode", "fully_async", "--max-staleness", "2",
                                "--metrics", cluster.dir() + "/async.jsonl", "--plot",
                                cluster.dir() + "/async.png", "--cluster", cluster.endpoint()};
  child_process job(args, cluster.dir() + "/async.log", passive_omp);
  ASSERT_EQ(job.wait_exit(180s), 0) << job.log() << cluster.logs();
  auto out = job.log();
  expect_trainer_and_engines_apart(out);
  auto records = read_jsonl(cluster.dir() + "/async.jsonl");
  ASSERT_FALSE(records.empty());
  for (const auto& r : records) {
    EXPECT_EQ(r["mode"], "fully_async");
    EXPECT_LE(r["staleness_max"].get<int64_t>(), 2) << r.dump();
  }
  EXPECT_NE(out.find("grpo: ok"), std::string::npos) << out;
}
