// The GRPO job recovering from the loss of its trainer's node in place (--max-restarts,
// placement split, sync mode): the node holding the policy and the reference is SIGKILLed, or
// hung by SIGSTOP, after step 3; both are placed again on a node left, restored from the last checkpoint, the job
// rolls back to it and replays the steps after it. With batch-invariant numerics the replayed
// steps give the uninterrupted run's metrics exactly. With no room left the job fails at
// --recovery-timeout, naming it.
#include <gtest/gtest.h>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "tests/cluster/cluster_fixture.hpp"

using namespace rlforge::cluster_test;
using namespace std::chrono_literals;

namespace {

constexpr int steps = 8, prompts = 8, group = 4;

/// The job with a checkpoint every 2 steps into DIR/TAG_ckpt, bf16 batch-invariant numerics (the
/// same bits on every run and every CPU), weight syncs over Gloo (a new sender needs a new
/// channel), then `extra`.
std::vector<std::string> job(test_cluster& cluster, const std::string& tag,
                             std::vector<std::string> extra) {
  std::vector<std::string> args{"--steps",          std::to_string(steps),
                                "--prompts",        std::to_string(prompts),
                                "--group",          std::to_string(group),
                                "--sft-steps",      "300",
                                "--held-out",       "20",
                                "--compute-dtype",  "bf16",
                                "--batch-invariant",
                                "--checkpoint-every", "2",
                                "--checkpoint-dir", cluster.dir() + "/" + tag + "_ckpt",
                                "--weight-transport", "gloo"};
  args.insert(args.end(), extra.begin(), extra.end());
  return grpo_split_job(cluster, tag, args);
}

/// Waits for the job's third step record (polling every 5 ms), then sends `sig` to the trainer's
/// node; that node.
std::string lose_trainer_after_step_3(test_cluster& cluster, child_process& grpo,
                                      const std::string& tag, int sig) {
  const std::string where = "policy (1 rank) and ref (1) on node '";
  if (!grpo.wait_for_log(where, 120s))
    return {};
  auto node = quoted_after(grpo.log(), where);
  for (int i = 0;
       i < 24000 && read_jsonl(cluster.dir() + "/" + tag + ".jsonl").size() < 3 && grpo.running();
       ++i)
    std::this_thread::sleep_for(5ms);
  cluster.node(node).signal(sig);
  return node;
}

/// What a step trained on and measured: everything but times and the engines' version counter.
nlohmann::json training_figures(const nlohmann::json& r) {
  nlohmann::json out;
  for (const char* k : {"step", "reward", "accuracy", "loss", "kl", "entropy", "grad_norm",
                        "tokens", "samples", "logprob_gap"})
    out[k] = r.at(k);
  return out;
}

/// Runs the job as `tag` on `cluster`, sends `sig` to its trainer's node after step 3, and
/// checks that it healed: every step once, each with the bits of `expected`'s, one recovery on
/// another node rolled back to the checkpoint before the loss.
void expect_healed_run(test_cluster& cluster, const std::string& tag, int sig,
                       const std::vector<nlohmann::json>& expected) {
  child_process grpo(job(cluster, tag, {"--max-restarts", "1"}),
                     cluster.dir() + "/" + tag + ".log", passive_omp);
  auto lost = lose_trainer_after_step_3(cluster, grpo, tag, sig);
  ASSERT_FALSE(lost.empty()) << grpo.log() << cluster.logs();
  auto rc = grpo.wait_exit(180s);
  if (sig == SIGSTOP)
    cluster.node(lost).signal(SIGCONT);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 0) << grpo.log() << cluster.logs();
  auto rs = read_jsonl(cluster.dir() + "/" + tag + ".jsonl");
  ASSERT_EQ(rs.size(), expected.size()) << grpo.log();
  int recoveries = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    // No sample lost or counted twice: every step once, on all its samples, with the bits of
    // the uninterrupted run's step.
    EXPECT_EQ(rs[i]["step"], i + 1);
    EXPECT_EQ(training_figures(rs[i]), training_figures(expected[i])) << tag << " step " << i + 1;
    if (!rs[i].contains("recoveries"))
      continue;
    for (auto& rec : rs[i]["recoveries"]) {
      ++recoveries;
      EXPECT_NE(rec["trainer_node"], lost) << rec.dump();
      const int back = rec["rolled_back_to"].get<int>();
      const int at = rec["lost_at_step"].get<int>();
      // The checkpoint before the loss (every 2 steps), and the record after it carries this.
      EXPECT_EQ(back, (at - 1) / 2 * 2) << rec.dump();
      EXPECT_EQ(static_cast<int>(i) + 1, back + 1) << rec.dump();
      EXPECT_EQ(rec["steps_replayed"], at - 1 - back) << rec.dump();
      std::printf("[ figure   ] %s: trainer replaced on '%s' and restored from step %d %.3f s "
                  "after the loss was seen (lost during step %d; %d finished steps replayed)\n",
                  sig == SIGKILL ? "SIGKILL" : "SIGSTOP",
                  rec["trainer_node"].get<std::string>().c_str(), back,
                  rec["seconds"].get<double>(), at, rec["steps_replayed"].get<int>());
    }
  }
  EXPECT_EQ(recoveries, 1) << grpo.log();
  EXPECT_NE(grpo.log().find("grpo: ok"), std::string::npos) << grpo.log();
}

} // namespace

TEST(ClusterTrainerRecovery, ALostTrainersNodeIsReplacedAndTheReplayedStepsRepeatTheirBits) {
  test_cluster cluster{"heal_trainer"};
  for (auto id : {"n1", "n2", "n3"})
    cluster.add_node(id, 1, 2);
  // The uninterrupted run.
  child_process base(job(cluster, "base", {"--max-restarts", "1"}), cluster.dir() + "/base.log",
                     passive_omp);
  auto base_rc = base.wait_exit(180s);
  ASSERT_TRUE(base_rc.has_value()) << base.log();
  ASSERT_EQ(*base_rc, 0) << base.log() << cluster.logs();
  auto expected = read_jsonl(cluster.dir() + "/base.jsonl");
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  // Killed: the loss is seen at once.
  expect_healed_run(cluster, "killed", SIGKILL, expected);
  // Hung: the loss is seen once the head declares the node dead; a node joins for the next
  // replacement (the killed one is gone).
  cluster.add_node("n4", 1, 2);
  expect_healed_run(cluster, "stopped", SIGSTOP, expected);
}

TEST(ClusterTrainerRecovery, WithNoRoomLeftTheJobFailsAtTheRecoveryTimeout) {
  test_cluster cluster{"heal_trainer_no_room"};
  cluster.add_node("n1", 1, 2);
  cluster.add_node("n2", 1, 2);
  child_process grpo(job(cluster, "job", {"--max-restarts", "1", "--recovery-timeout", "3"}),
                     cluster.dir() + "/job.log", passive_omp);
  auto lost = lose_trainer_after_step_3(cluster, grpo, "job", SIGKILL);
  ASSERT_FALSE(lost.empty()) << grpo.log() << cluster.logs();
  auto rc = grpo.wait_exit(60s);
  ASSERT_TRUE(rc.has_value()) << grpo.log();
  EXPECT_EQ(*rc, 1) << grpo.log();
  EXPECT_NE(grpo.log().find("no policy and reference within 3 s (--recovery-timeout)"),
            std::string::npos)
      << grpo.log();
}
