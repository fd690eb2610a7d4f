// A cluster head restarted from its state file (`rlforge head --state FILE`) takes its cluster
// back: the nodes join it again keeping their ranks, the driver attaches again, and the
// placement groups and actor groups are where they were. A GRPO job runs through the restart,
// then loses its engines' node and re-places them through the restarted head, and finishes. A
// head restarted without its state file is another cluster: the nodes stop their ranks. Bad
// --state and --head-grace-ms values are refused by name.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "runtime/errc.hpp"
#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge;
using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

/// Polls `path` until it holds at least `n` records or `job` ends.
void wait_for_records(const std::string& path, size_t n, child_process& job) {
  for (int i = 0; i < 24000 && read_jsonl(path).size() < n && job.running(); ++i)
    std::this_thread::sleep_for(5ms);
}

/// Waits until `process`'s log holds `text` `times` times (at most 60 s).
bool wait_for_count(child_process& process, const std::string& text, int times) {
  for (int i = 0; i < 600; ++i) {
    const auto log = process.log();
    int n = 0;
    for (auto at = log.find(text); at != std::string::npos; at = log.find(text, at + 1))
      ++n;
    if (n >= times)
      return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

} // namespace

TEST(ClusterHeadRestart, AJobGoesOnThroughAHeadRestartAndHealsThroughTheNewHead) {
  const std::string state =
      ::testing::TempDir() + "/head_restart_" + std::to_string(::getpid()) + ".db";
  std::filesystem::remove(state);
  test_cluster cluster{"head_restart", {"--state", state}};
  for (auto id : {"n1", "n2", "n3"})
    cluster.add_node(id, 1, 2);
  const std::string metrics = cluster.dir() + "/job.jsonl";
  child_process grpo(grpo_split_job(cluster, "job",
                                    {"--steps", "300", "--prompts", "16", "--group", "4",
                                     "--sft-steps", "40", "--held-out", "20", "--max-restarts",
                                     "1"}),
                     cluster.dir() + "/job.log", passive_omp);
  ASSERT_TRUE(grpo.wait_for_log("engines (1) on node '", 120s)) << grpo.log() << cluster.logs();
  const auto engines = quoted_after(grpo.log(), "engines (1) on node '");
  wait_for_records(metrics, 3, grpo);
  ASSERT_TRUE(grpo.running()) << grpo.log();

  // kill -9 of the head, and a new one on the same port and state file. A read made while
  // the head is away waits for it; a change fails at once, saying so.
  test_driver reader{cluster.endpoint()};
  ASSERT_TRUE(reader.error().empty()) << reader.error();
  cluster.head().kill();
  std::string why; // once the driver's session has seen the loss
  for (int i = 0; i < 100 && why.find("waiting up to") == std::string::npos; ++i) {
    auto change = reader.pgs().create({"x", {{{"CPU", 1}}}, "pack", 5});
    ASSERT_FALSE(change);
    why = error_message(change.error());
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(why.find("the cluster head at " + cluster.endpoint() + " is lost"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("waiting up to"), std::string::npos) << why;
  auto read = std::async(std::launch::async, [&] { return reader.pgs().get("training"); });
  std::this_thread::sleep_for(200ms); // the read is held by the session
  cluster.restart_head();
  auto got = read.get();
  ASSERT_TRUE(got) << reader.sys().render(got.error());
  EXPECT_EQ(got->bundles.size(), 1u);
  EXPECT_TRUE(cluster.head().wait_for_log("state_restored", 30s)) << cluster.logs();
  EXPECT_TRUE(cluster.head().wait_for_log("driver_attached_again", 30s))
      << cluster.logs() << grpo.log();
  for (auto id : {"n1", "n2", "n3"})
    EXPECT_TRUE(wait_for_count(cluster.node(id), "rejoined cluster", 1)) << cluster.logs();
  {
    // The restarted head shows the job's placement groups and actor groups as they were.
    test_driver observer{cluster.endpoint()};
    ASSERT_TRUE(observer.error().empty()) << observer.error();
    auto s = observer.status();
    for (auto& n : s["nodes"])
      EXPECT_EQ(n["alive"], true) << s.dump(2);
    std::set<std::string> pgs, groups;
    for (auto& g : s["placement_groups"]) {
      EXPECT_EQ(g["state"], "placed") << s.dump(2);
      pgs.insert(g["name"].get<std::string>());
    }
    for (auto& g : s["actor_groups"]) {
      EXPECT_EQ(g["state"], "alive") << s.dump(2);
      groups.insert(g["name"].get<std::string>());
    }
    EXPECT_EQ(pgs, (std::set<std::string>{"training", "generation"})) << s.dump(2);
    EXPECT_EQ(groups, (std::set<std::string>{"policy", "ref", "engines"})) << s.dump(2);
  }
  // The job goes on; then its engines' node is lost and re-placed through the new head.
  const auto before = read_jsonl(metrics).size();
  wait_for_records(metrics, before + 2, grpo);
  ASSERT_TRUE(grpo.running()) << grpo.log();
  cluster.node(engines).signal(SIGKILL);
  auto rc = grpo.wait_exit(180s);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 0) << grpo.log() << cluster.logs();
  auto rs = read_jsonl(metrics);
  EXPECT_EQ(rs.size(), 300u) << grpo.log();
  int recoveries = 0;
  for (auto& r : rs)
    if (r.contains("recoveries"))
      recoveries += static_cast<int>(r["recoveries"].size());
  EXPECT_EQ(recoveries, 1) << grpo.log();
  // The replayed placement table matched the old one operation for operation (every
  // reservation got its old id back), and the job's end freed everything it held.
  EXPECT_EQ(cluster.head().log().find("state_replay"), std::string::npos) << cluster.head().log();
  EXPECT_TRUE(eventually([&] { return reader.status(); },
                         [](const nlohmann::json& s) {
                           if (!s["placement_groups"].empty() || !s["actor_groups"].empty())
                             return false;
                           for (auto& n : s["nodes"])
                             if (n["alive"] == true && n["available"]["GPU"] != n["total"]["GPU"])
                               return false;
                           return true;
                         },
                         20s))
      << reader.status().dump(2);
  std::filesystem::remove(state);
}

TEST(ClusterHeadRestart, AHeadRestartedWithoutItsStateIsAnotherClusterAndTheRanksStop) {
  test_cluster cluster{"head_restart_no_state"};
  cluster.add_node("n1", 1, 1);
  test_driver driver{cluster.endpoint()};
  ASSERT_TRUE(driver.error().empty()) << driver.error();
  auto pg = driver.pgs().create({"one", {{{"GPU", 1}}}, "pack", 10});
  ASSERT_TRUE(pg);
  auto group = driver.spawn_group("g", "ref", *pg);
  ASSERT_TRUE(group) << driver.sys().render(group.error());
  cluster.restart_head();
  // The node keeps its ranks while the head is away, then finds another cluster.
  ASSERT_TRUE(cluster.node("n1").wait_for_log("rejoined cluster", 30s)) << cluster.logs();
  bool failed = false;
  for (int i = 0; i < 200 && !failed; ++i) {
    failed = !group->call_all(actors::rank_ops::ping.id, caf::message{}, 5s);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(failed) << "the ranks outlived their cluster";
  // The driver is told why it cannot go on (once it has tried to attach again).
  std::string why;
  for (int i = 0; i < 100 && why.find("came back as another cluster") == std::string::npos;
       ++i) {
    auto again = driver.pgs().create({"x", {{{"GPU", 1}}}, "pack", 5});
    ASSERT_FALSE(again);
    why = error_message(again.error());
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(why.find("came back as another cluster"), std::string::npos) << why;
  EXPECT_NE(why.find("the cluster head at " + cluster.endpoint() + " is lost"), std::string::npos)
      << why;
  group->stop();
}

TEST(ClusterHeadRestart, BadStateAndGraceFlagsAreRefused) {
  const std::string dir = ::testing::TempDir();
  const std::string garbage = dir + "/not_a_state.db";
  {
    std::ofstream out(garbage);
    out << "this is not SQLite, and it is long enough to hold a header of one: "
        << std::string(200, 'x');
  }
  for (const auto& [args, says] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--state", dir + "/no/such/dir/state.db"}, "no/such/dir/state.db: cannot open it"},
           {{"--state", garbage}, "not a head state file"},
           {{"--head-grace-ms", "-1"}, "head-grace-ms must be in 0..3600000"}}) {
    std::vector<std::string> argv = {rlforge_binary(), "head", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    child_process head(argv, dir + "/bad-state.log");
    EXPECT_EQ(head.wait_exit(30s), 2) << head.log();
    EXPECT_NE(head.log().find(says), std::string::npos) << head.log();
  }
  std::filesystem::remove(garbage);
}
