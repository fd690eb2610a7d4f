// Section 7 of cluster_bench (see cluster_bench.cpp for all sections): time to recover on the
// GRPO job (head + 3 nodes, placement split, sync mode, --max-restarts 1, a checkpoint every 2
// steps) when the node holding the engines, or the one holding the policy and ref, is SIGKILLed
// or SIGSTOPped after step 3; then `rlforge serve --cluster --max-restarts 1` losing its model's
// node; then a head restarted from its state file.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/protocol.hpp"
#include "actors/rank_actor.hpp"
#include "actors/trainer_client.hpp"
#include "bench/bench_util.hpp"
#include "bench/cluster_bench_support.hpp"
#include "service/tinker_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/tinker_datums.hpp"

namespace rlforge::cluster_bench {

using rlforge::bench::clock_type;
using rlforge::bench::median;
using rlforge::bench::seconds_since;
using namespace std::chrono_literals;

namespace {

/// One GRPO run losing the node of `role` ("engines" or "trainer") to `sig` after step 3: the
/// seconds from the signal to the job seeing the loss and to training again, and the finished
/// steps replayed.
struct recovery_run {
  double detect = 0, total = 0;
  int replayed = 0;
};

recovery_run recover_once(const std::string& role, int sig, int rep) {
  const std::string tag =
      "bench_heal_" + role + "_" + std::to_string(sig) + "_" + std::to_string(rep);
  test_cluster cluster{tag, {"--heartbeat-ms", "200", "--dead-after-ms", "1000"}};
  for (auto id : {"n1", "n2", "n3"})
    cluster.add_node(id, 1, 2, {"--heartbeat-ms", "200", "--dead-after-ms", "1000"});
  auto args = grpo_split_job(cluster, "job",
                             {"--steps", "8", "--prompts", "16", "--group", "4", "--sft-steps",
                              "40", "--held-out", "20", "--max-restarts", "1",
                              "--checkpoint-every", "2", "--checkpoint-dir",
                              cluster.dir() + "/ckpt"});
  child_process job(args, cluster.dir() + "/job.log", {{"OMP_WAIT_POLICY", "PASSIVE"}});
  const std::string where = role == "engines" ? "engines (1) on node '"
                                              : "policy (1 rank) and ref (1) on node '";
  if (!job.wait_for_log(where, 120s))
    die("grpo did not start:\n" + job.log() + cluster.logs());
  const auto node = quoted_after(job.log(), where);
  while (read_jsonl(cluster.dir() + "/job.jsonl").size() < 3 && job.running())
    std::this_thread::sleep_for(5ms);
  const double signalled =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  cluster.node(node).signal(sig);
  auto rc = job.wait_exit(180s);
  if (sig == SIGSTOP)
    cluster.node(node).signal(SIGCONT);
  if (rc.value_or(-1) != 0)
    die("grpo (" + tag + ") did not heal:\n" + job.log() + cluster.logs());
  for (auto& r : read_jsonl(cluster.dir() + "/job.jsonl"))
    for (auto& rec : r.value("recoveries", nlohmann::json::array())) {
      const double seen = rec.at("seen_at_unix").get<double>();
      return {seen - signalled, seen + rec.at("seconds").get<double>() - signalled,
              rec.at("steps_replayed").get<int>()};
    }
  die("grpo (" + tag + ") recorded no recovery:\n" + job.log());
}

/// A head restarted from its state file (kill -9, a new head on the same port and file) under
/// a driver holding a placement group with a group of 2 ranks on 2 nodes: the seconds from the
/// kill to the driver's status answered by the new head, and to every node joined again.
std::pair<double, double> head_restart_once(int rep) {
  const std::string tag = "bench_head_restart_" + std::to_string(rep);
  const std::string state =
      (std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(::getpid()) + ".db"))
          .string();
  std::filesystem::remove(state);
  const std::vector<std::string> beats{"--heartbeat-ms", "200", "--dead-after-ms", "1000"};
  auto head_args = beats;
  head_args.insert(head_args.end(), {"--state", state});
  test_cluster cluster{tag, head_args};
  cluster.add_node("n1", 1, 2, beats);
  cluster.add_node("n2", 1, 2, beats);
  test_driver d{cluster.endpoint(), beats};
  if (!d.error().empty())
    die("attach: " + d.error() + "\n" + cluster.logs());
  auto pg = or_die(d.pgs().create({"both", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10}),
                   d.sys(), "placement group");
  auto group = spawn_group(d, "g", "ref", pg, 2);
  auto t0 = clock_type::now();
  cluster.restart_head();
  double answered = -1, rejoined = -1;
  while (rejoined < 0 && seconds_since(t0) < 60) {
    auto s = d.status(); // held by the session until the head is back
    if (!s.contains("error")) {
      if (answered < 0)
        answered = seconds_since(t0);
      bool all = true;
      for (auto& n : s["nodes"])
        all = all && n["alive"] == true && !n.value("rejoining", false);
      if (all)
        rejoined = seconds_since(t0);
    }
    if (rejoined < 0)
      std::this_thread::sleep_for(10ms);
  }
  if (rejoined < 0 || !group.call_all(rank_ops::ping, 10s))
    die("the cluster did not come back after its head restarted:\n" + cluster.logs());
  group.stop();
  std::filesystem::remove(state);
  return {answered, rejoined};
}

/// `rlforge serve --cluster --max-restarts 1` (a recovery checkpoint every 2 optimizer steps)
/// whose one model trained 3 SFT steps when its node gets `sig` (a second node waits): the
/// seconds from the signal to the next forward_backward answered (healed: placed again, rebuilt
/// from the checkpoint, one step replayed), and the same call on the healthy service before.
std::pair<double, double> serve_recovery_once(int sig, int rep) {
  const std::vector<std::string> beats{"--heartbeat-ms", "200", "--dead-after-ms", "1000"};
  test_cluster cluster{"bench_serve_heal_" + std::to_string(sig) + "_" + std::to_string(rep),
                       beats};
  cluster.add_node("n1", 1, 2, beats);
  auto serve = start_serve(
      cluster, {"--max-restarts", "1", "--recovery-checkpoint-every", "2"}, beats);
  if (serve.port == 0)
    die("rlforge serve did not start:\n" + serve.log() + cluster.logs());
  service::tinker_client client("127.0.0.1", serve.port, "");
  tinker::lora_config lora;
  lora.rank = 4;
  tinker::forward_backward_request req;
  req.loss_fn = "cross_entropy";
  req.data = {sft_datum({1, 5, 9, 13, 17, 21}), sft_datum({2, 4, 6, 8})};
  int64_t seq = 0;
  double healthy = 0;
  try {
    req.model_id = client.create_model(client.create_session(), 0, "base", lora);
    tinker::adam_params adam;
    for (int step = 0; step < 3; ++step) {
      req.seq_id = ++seq;
      auto t0 = clock_type::now();
      client.forward_backward(req);
      healthy = seconds_since(t0);
      client.optim_step(req.model_id, ++seq, adam);
    }
    cluster.add_node("n2", 1, 2, beats);
    cluster.node("n1").signal(sig);
    auto t0 = clock_type::now();
    req.seq_id = ++seq;
    client.forward_backward(req);
    const double healed = seconds_since(t0);
    if (sig == SIGSTOP)
      cluster.node("n1").signal(SIGCONT);
    serve.kill();
    return {healed, healthy};
  } catch (const service::client_error& e) {
    die(std::string{"rlforge serve did not heal: "} + e.what() + "\n" + serve.log() +
        cluster.logs());
  }
}

} // namespace

void recovery(int reps) {
  for (const std::string role : {"engines", "trainer"})
    for (int sig : {SIGKILL, SIGSTOP}) {
      std::vector<double> detect, total;
      int replayed = 0;
      for (int rep = 0; rep < reps; ++rep) {
        auto r = recover_once(role, sig, rep);
        detect.push_back(r.detect);
        total.push_back(r.total);
        replayed = std::max(replayed, r.replayed);
      }
      const double m = median(total);
      std::printf("cluster.recovery %s node %s: %.2f s from the signal to training again "
                  "(median of %d; max %.2f), detection %.2f s, replacement %.2f s; %d finished "
                  "steps replayed | Ray 15-30 s to notice | goal <= 5 s + replayed steps: %s\n",
                  role.c_str(), sig == SIGKILL ? "SIGKILL" : "SIGSTOP", m, reps,
                  *std::max_element(total.begin(), total.end()), median(detect),
                  m - median(detect), replayed, verdict(m <= 5.0));
    }
  for (int sig : {SIGKILL, SIGSTOP}) {
    std::vector<double> healed, healthy;
    for (int rep = 0; rep < reps; ++rep) {
      auto [h, ok] = serve_recovery_once(sig, rep);
      healed.push_back(h);
      healthy.push_back(ok);
    }
    const double m = median(healed);
    std::printf("cluster.recovery rlforge serve node %s: the next forward_backward answered "
                "%.2f s after the signal (median of %d; max %.2f; placed again, the model "
                "rebuilt, 1 step replayed), %.1fx a healthy call (%.3f s) | goal <= 5 s: %s\n",
                sig == SIGKILL ? "SIGKILL" : "SIGSTOP", m, reps,
                *std::max_element(healed.begin(), healed.end()), m / median(healthy),
                median(healthy), verdict(m <= 5.0));
  }
  std::vector<double> answered, rejoined;
  for (int rep = 0; rep < reps; ++rep) {
    auto [a, r] = head_restart_once(rep);
    answered.push_back(a);
    rejoined.push_back(r);
  }
  std::printf("cluster.recovery head restart (kill -9, restarted on its state file; includes "
              "starting the new head): a driver's read answered %.2f s after the kill, every "
              "node joined again with its ranks %.2f s (medians of %d) | Ray: an external Redis "
              "and a head restart | goal <= 5 s: %s\n",
              median(answered), median(rejoined), reps, verdict(median(rejoined) <= 5.0));
}

} // namespace rlforge::cluster_bench
