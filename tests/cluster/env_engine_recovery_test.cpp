// The GRPO job on an environment's multi-turn episodes (--env, fully async, placement split)
// losing its engines' node mid-episode: with --max-restarts 1 new engines are placed on a node
// left and get the policy's weights while the episodes in flight wait; each resumes at the turn
// that failed, so no episode is lost or fails and every step trains on all of its episodes.
#include <gtest/gtest.h>

#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

constexpr int steps = 8, prompts = 2, group = 4;

} // namespace

TEST(ClusterEnvEngineRecovery, EpisodesInFlightResumeOnReplacedEngines) {
  if (std::string{python_binary()}.empty())
    GTEST_SKIP() << "no Python interpreter for the example environment";
  test_cluster cluster{"env_heal"};
  for (auto id : {"n1", "n2", "n3"})
    cluster.add_node(id, 1, 2);
  const auto model = cluster.dir() + "/model";
  child_process init({rlforge_binary(), "init-model", "--preset", "tiny", "--seed", "3", "--out",
                      model},
                     cluster.dir() + "/init.log");
  ASSERT_EQ(init.wait_exit(60s), 0) << init.log();
  const std::string env =
      std::string{python_binary()} + " " + example_envs_dir() + "/guess_number.py";
  // Each environment step sleeps 20-100 ms (a tool call), so episodes are in flight on every
  // worker thread when the node goes.
  const auto out = cluster.dir() + "/job";
  child_process grpo({grpo_example_binary(), "--placement", "split", "--quiet", "--cluster",
                      cluster.endpoint(), "--metrics", out + ".jsonl", "--plot", out + ".png",
                      "--quick", "--steps", std::to_string(steps), "--prompts",
                      std::to_string(prompts), "--group", std::to_string(group), "--mode",
                      "fully_async", "--max-staleness", "2", "--max-restarts", "1", "--model",
                      model, "--env", env, "--env-task", R"({"tool_latency_ms": [20, 100]})"},
                     out + ".log", passive_omp);
  ASSERT_TRUE(grpo.wait_for_log("engines (1) on node '", 120s)) << grpo.log() << cluster.logs();
  const auto lost = quoted_after(grpo.log(), "engines (1) on node '");
  for (int i = 0;
       i < 24000 && read_jsonl(cluster.dir() + "/job.jsonl").size() < 2 && grpo.running(); ++i)
    std::this_thread::sleep_for(5ms);
  cluster.node(lost).signal(SIGKILL);

  auto rc = grpo.wait_exit(180s);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 0) << grpo.log() << cluster.logs();
  auto rs = read_jsonl(cluster.dir() + "/job.jsonl");
  EXPECT_EQ(rs.size(), static_cast<size_t>(steps)) << grpo.log();
  int recoveries = 0;
  int64_t requeued = 0;
  for (auto& r : rs) {
    // No episode lost or failed: every step trained on all of its groups' episodes.
    EXPECT_EQ(r["episodes"], prompts * group) << r.dump();
    EXPECT_EQ(r["episodes_failed"], 0) << r.dump();
    requeued += r["requeued"].get<int64_t>();
    if (r.contains("recoveries"))
      for (auto& rec : r["recoveries"]) {
        ++recoveries;
        EXPECT_NE(rec["engines_node"], lost) << rec.dump();
        std::printf("[ figure   ] engines replaced on '%s' after %.3f s\n",
                    rec["engines_node"].get<std::string>().c_str(), rec["seconds"].get<double>());
      }
  }
  std::printf("[ figure   ] %lld turns sampled again\n", static_cast<long long>(requeued));
  EXPECT_EQ(recoveries, 1) << grpo.log();
  EXPECT_NE(grpo.log().find("the episodes in flight wait and resume"), std::string::npos)
      << grpo.log();
  EXPECT_NE(grpo.log().find("grpo: ok"), std::string::npos) << grpo.log();
}
