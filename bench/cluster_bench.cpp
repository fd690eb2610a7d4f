// A cluster on this machine (`rlforge head` and two `rlforge node` processes on 127.0.0.1, this
// program the driver), each figure against its peer or limit measured in the same run:
//  1. control round trip driver -> group of 4 ranks spread over the 2 node processes ->
//     gathered reply, empty payload, from an event-based driver; peer: one remote rank's round
//     trip (CAF's loopback RTT); goal <= 300 us median.
//  2. remote rank spawn rate: ranks in groups of 16 (8 per node) spawned through the node
//     agents, counted when every rank answered its first call; peer: Ray's 551 actors/s on one
//     node; goal >= 2,000 ranks/s.
//  3. weight sync from a policy rank on one node to an engine on the other over Gloo (a
//     ~160 MB model computing in fp32, then in bf16: its GEMM weights travel as bf16), as a
//     ratio to raw TCP loopback bandwidth of the fp32 bytes (two sockets in this process); goal
//     >= 0.8 for fp32. Then the fp32 sync with the engine's node in a network namespace of its
//     own, against raw TCP over the same veth pair (where root and `ip` allow). Then delta
//     syncs against full ones, each after a training step (bf16, fp32, and bf16 with LoRA
//     rank 16, whose delta syncs send the adapters): bytes and time.
//  4. node death detection: a node process SIGKILLed / SIGSTOPped, until the head reports it
//     dead (polled every 10 ms), with rlforge's default heartbeats (200 ms, dead after 1 s);
//     goal <= 2 s.
//  5. the GRPO job (examples/grpo, layout split: policy + ref on one bundle, 2 engines on the
//     other) on 2 node processes vs embedded on one node, same work per role: median step time
//     ratio. Skipped with --quick.
//  6. scale: for 1, 2, 4 and 8 node processes, the head's CPU per node per second while idle
//     (heartbeats every 200 ms) and the remote spawn rate over every node.
//  7. (cluster_recovery_bench.cpp) time to recover on the GRPO job (head + 3 nodes, placement
//     split, sync mode, --max-restarts 1, a checkpoint every 2 steps): the node holding the
//     engines, or the one holding the policy and ref, SIGKILLed or SIGSTOPped after step 3;
//     from the signal to training again (new ranks placed, restored, the engines synced), split
//     into detection (signal -> the job sees the loss) and replacement, with the steps
//     replayed; goal <= 5 s plus the replayed steps. Then `rlforge serve --cluster --max-restarts 1` losing its
//     model's node: from the signal to the next forward_backward answered, against that call
//     on the healthy service. Then a head restarted from its state file.
// Medians of repeated runs.
//
// Usage: cluster_bench [--quick] [--scale | --recovery]   (only section 6, or 7)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_actor.hpp"
#include "actors/trainer_client.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/training_batch.hpp"
#include "bench/bench_util.hpp"
#include "bench/cluster_bench_support.hpp"
#include "service/tinker_client.hpp"
#include "tests/cluster/cluster_fixture.hpp"
#include "tests/cluster/network_namespace.hpp"
#include "tests/cluster/tinker_datums.hpp"
#include "tinker/types.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace rlforge::cluster_test;
using rlforge::bench::clock_type;
using rlforge::bench::median;
using rlforge::bench::seconds_since;
using namespace std::chrono_literals;

namespace {

using rlforge::cluster_bench::die;
using rlforge::cluster_bench::or_die;
using rlforge::cluster_bench::prog;
using rlforge::cluster_bench::spawn_group;
using rlforge::cluster_bench::verdict;

/// Round trips of `request` from an event-based driver, in microseconds.
template <class Send>
std::vector<double> round_trips(caf::actor_system& sys, int n, Send send) {
  struct state {
    std::vector<double> us;
    clock_type::time_point sent;
  };
  caf::scoped_actor self{sys};
  auto reply_to = caf::actor_cast<caf::actor>(self);
  auto driver = sys.spawn([=](caf::stateful_actor<state>* d) -> caf::behavior {
    auto next = [=] {
      d->state.sent = clock_type::now();
      send(d);
    };
    next();
    auto done = [=] {
      d->state.us.push_back(seconds_since(d->state.sent) * 1e6);
      if (static_cast<int>(d->state.us.size()) < n)
        next();
      else
        d->send(reply_to, d->state.us);
    };
    return {
      [=](std::vector<caf::message>&) { done(); },
      [=](op_result&) { done(); },
    };
  });
  std::vector<double> out;
  self->receive([&](std::vector<double>& us) { out = std::move(us); });
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
  return out;
}

void control_round_trip(test_driver& d) {
  auto pg = or_die(d.pgs().create({"rtt", std::vector<resource_amounts>(4, {{"CPU", 1}}),
                                   "spread", 10}),
                   d.sys(), "create rtt group");
  auto group = spawn_group(d, "rtt", "ref", pg, 4);
  auto handles = or_die(group.rank_handles(), d.sys(), "rank handles");
  auto g = group.handle();
  auto one = handles.at(0);
  round_trips(d.sys(), 200, [=](caf::event_based_actor* a) {
    a->send(g, all_atom::value, rank_ops::ping.id, caf::message{}, int64_t{10000});
  });
  auto group_us = median(round_trips(d.sys(), 2000, [=](caf::event_based_actor* a) {
    a->send(g, all_atom::value, rank_ops::ping.id, caf::message{}, int64_t{10000});
  }));
  auto single_us = median(round_trips(
      d.sys(), 2000, [=](caf::event_based_actor* a) { a->send(one, rank_ops::ping.call()); }));
  std::printf("cluster.rtt group of 4 ranks on 2 node processes, event-based driver: %.0f us "
              "(median of 2000) | one remote rank (CAF loopback RTT): %.0f us, ratio %.2f | "
              "goal <= 300 us: %s\n",
              group_us, single_us, group_us / single_us, verdict(group_us <= 300));
  group.stop();
  d.pgs().remove("rtt");
}

/// Ranks per second (median of 3 rounds) of `groups` groups of `per_group` ranks spawned on
/// `pg` through the node agents, counted when every rank answered its first call.
double spawn_rate_on(test_driver& d, const placement_group_info& pg, int groups, int per_group) {
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<actor_group> spawned;
    auto t0 = clock_type::now();
    for (int i = 0; i < groups; ++i)
      spawned.push_back(spawn_group(d, "s" + std::to_string(rep) + "_" + std::to_string(i), "ref",
                                    pg, per_group));
    for (auto& g : spawned)
      or_die(g.call_all(rank_ops::ping, 60s), d.sys(), "first call");
    rates.push_back(groups * per_group / seconds_since(t0));
    for (auto& g : spawned)
      g.stop();
    // Let the nodes reap the threads before the next round.
    std::this_thread::sleep_for(500ms);
  }
  return median(rates);
}

void spawn_rate(test_driver& d, int groups) {
  constexpr int per_group = 16;
  auto pg = or_die(d.pgs().create({"spawn", std::vector<resource_amounts>(2, {{"CPU", 1}}),
                                   "strict_spread", 10}),
                   d.sys(), "create spawn group");
  auto r = spawn_rate_on(d, pg, groups, per_group);
  std::printf("cluster.spawn %d ranks (groups of %d, 8 per node) through 2 node agents: %.0f "
              "ranks/s (median of 3) | vs Ray 551/s: %.1fx | goal >= 2000/s: %s\n",
              groups * per_group, per_group, r, r / 551.0, verdict(r >= 2000));
  d.pgs().remove("spawn");
}

/// Where a raw TCP baseline receives: an address of this network namespace, or of the named
/// one (`ip netns`), which its receiving thread joins (then the bytes cross the veth pair).
struct tcp_path {
  std::string address = "127.0.0.1";
  std::string netns; ///< empty: this process's namespace
};

/// Bytes per second of `bytes` sent over one TCP connection between two threads of this
/// process (median of `reps`), received at `path`: from and into a 1 MiB buffer that stays in
/// cache, or, with `whole`, from one buffer of `bytes` into another (the memory traffic a
/// weight sync has).
double tcp_bandwidth(size_t bytes, int reps = 3, bool whole = false, const tcp_path& path = {}) {
  std::promise<sockaddr_in> listening;
  auto bound = listening.get_future();
  std::vector<double> secs;
  std::thread receiver([&] {
    if (!path.netns.empty()) {
      int ns = open(("/var/run/netns/" + path.netns).c_str(), O_RDONLY);
      if (ns < 0 || setns(ns, CLONE_NEWNET) != 0)
        die("tcp baseline: cannot enter network namespace " + path.netns);
      close(ns);
    }
    int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    socklen_t len = sizeof(addr);
    if (server < 0 || inet_pton(AF_INET, path.address.c_str(), &addr.sin_addr) != 1
        || bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0
        || listen(server, 1) != 0
        || getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      die("tcp baseline: cannot listen on " + path.address);
    listening.set_value(addr);
    std::vector<char> buf(whole ? bytes : size_t{1} << 20, 'y');
    for (int rep = 0; rep < reps; ++rep) {
      int s = accept(server, nullptr, nullptr);
      size_t got = 0;
      auto t0 = clock_type::now();
      while (got < bytes) {
        auto at = whole ? got : 0;
        auto n = recv(s, buf.data() + at, buf.size() - at, 0);
        if (n <= 0)
          break;
        got += static_cast<size_t>(n);
      }
      secs.push_back(seconds_since(t0));
      close(s);
    }
    close(server);
  });
  auto addr = bound.get();
  std::vector<char> buf(whole ? bytes : size_t{1} << 20, 'x');
  for (int rep = 0; rep < reps; ++rep) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      die("tcp baseline: cannot connect to " + path.address);
    size_t sent = 0;
    while (sent < bytes) {
      auto at = whole ? sent : 0;
      auto n = send(c, buf.data() + at, std::min(buf.size() - at, bytes - sent), 0);
      if (n <= 0)
        break;
      sent += static_cast<size_t>(n);
    }
    close(c);
  }
  receiver.join();
  return static_cast<double>(bytes) / median(secs);
}

/// One policy rank on the first node and one engine on the second, joined by a dispatcher
/// whose syncs go over Gloo: the ~160 MB model computing in `dtype` on both (a bf16 model sends
/// its GEMM weights as bf16, half the bytes), the policy with LoRA adapters of `lora_rank` on
/// every projection when it is > 0. Stops everything when destroyed.
struct sync_pair {
  test_driver& d;
  placement_group_info pg;
  actor_group policy, engines;
  caf::actor dispatcher;
  std::unique_ptr<trainer_client> client;
  int64_t params = 0;

  sync_pair(test_driver& driver, const std::string& dtype, int64_t lora_rank = 0) : d(driver) {
    pg = or_die(d.pgs().create({"sync", {{{"GPU", 1}}, {{"GPU", 1}}}, "strict_spread", 10}),
                d.sys(), "create sync group");
    auto bundle = [&](size_t i) {
      auto one = pg;
      one.bundles = {pg.bundles.at(i)};
      return one;
    };
    policy = spawn_group(d, "policy", "policy", bundle(0), 1, true);
    engines = spawn_group(d, "engines", "engine", bundle(1), 1);
    dispatcher = spawn_dispatcher(d.sys());
    client = std::make_unique<trainer_client>(d.sys(), dispatcher, 300s);
    or_die(client->register_group("policy", policy), d.sys(), "register policy");
    or_die(client->register_engines(engines), d.sys(), "register engines");
    model_spec m;
    m.compute_dtype = dtype;
    m.config_json = nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                                   {"model_type", "llama"},
                                   {"vocab_size", 8192},
                                   {"hidden_size", 768},
                                   {"intermediate_size", 2048},
                                   {"num_hidden_layers", 4},
                                   {"num_attention_heads", 12},
                                   {"num_key_value_heads", 12},
                                   {"max_position_embeddings", 256},
                                   {"tie_word_embeddings", false}}
                      .dump();
    auto policy_model = m;
    policy_model.lora_rank = lora_rank;
    params = or_die(client->init_model("policy", policy_model), d.sys(), "init policy");
    or_die(client->init_model("engines", m), d.sys(), "init engines");
    auto ok = client->set_weight_transport("gloo");
    if (!ok)
      die("set_weight_transport: " + d.sys().render(ok.error()));
  }

  ~sync_pair() {
    policy.stop();
    engines.stop();
    caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
    d.pgs().remove("sync");
  }

  /// One sync: its wall time (pause + transfer + resume) and the bytes the sender sent.
  std::pair<double, int64_t> sync() {
    auto before = or_die(client->syncs(), d.sys(), "sync totals");
    auto t0 = clock_type::now();
    or_die(client->save_weights_for_sampler("policy"), d.sys(), "sync");
    const double secs = seconds_since(t0);
    auto after = or_die(client->syncs(), d.sys(), "sync totals");
    return {secs, after.bytes - before.bytes};
  }

  /// One training step of the policy: a cross-entropy batch of 8 sequences of 64 tokens, then
  /// AdamW at `lr` on its fp32 master weights.
  void train_step(double lr, uint64_t seed) {
    std::vector<std::vector<int64_t>> prompts, answers;
    for (uint64_t i = 0; i < 8; ++i) {
      prompts.emplace_back();
      answers.emplace_back();
      for (uint64_t t = 0; t < 32; ++t) {
        prompts.back().push_back(static_cast<int64_t>((seed * 7919 + i * 131 + t * 17) % 8192));
        answers.back().push_back(static_cast<int64_t>((seed * 104729 + i * 31 + t * 7) % 8192));
      }
    }
    or_die(client->forward_backward("policy", backends::from_sequences(prompts, answers),
                                    "cross_entropy"),
           d.sys(), "forward_backward");
    backends::adam_params p;
    p.learning_rate = lr;
    or_die(client->optim_step("policy", p), d.sys(), "optim_step");
  }
};

/// The sync of `sync_pair` computing in `dtype`: the median of 9 syncs against raw TCP
/// loopback of the fp32 model's bytes, measured in the same run.
void weight_sync(test_driver& d, const std::string& dtype, const tcp_path& path = {}) {
  sync_pair pair{d, dtype};
  auto& client = *pair.client;
  const auto& pg = pair.pg;
  const double fp32_bytes = static_cast<double>(pair.params) * 4;
  or_die(client.save_weights_for_sampler("policy"), d.sys(), "warm-up sync");
  auto before = or_die(client.syncs(), d.sys(), "sync totals");
  // Each sync is paired with a raw TCP transfer of the fp32 bytes right after it: the ratio of
  // each pair shares the machine's load of that moment; the figure is their median.
  std::vector<double> secs, tcp, tcp_whole, ratios, fp32_ratios;
  const int reps = 9;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = clock_type::now();
    or_die(client.save_weights_for_sampler("policy"), d.sys(), "sync");
    secs.push_back(seconds_since(t0));
    tcp.push_back(tcp_bandwidth(static_cast<size_t>(fp32_bytes), 1, false, path));
    tcp_whole.push_back(tcp_bandwidth(static_cast<size_t>(fp32_bytes), 1, true, path));
  }
  auto after = or_die(client.syncs(), d.sys(), "sync totals");
  const double wire = static_cast<double>(after.bytes - before.bytes) / reps;
  const double transfer = (after.seconds - before.seconds) / reps; // send to last commit
  auto status = or_die(client.status(), d.sys(), "status");
  for (size_t rep = 0; rep < secs.size(); ++rep) {
    ratios.push_back(wire / secs[rep] / tcp[rep]);
    fp32_ratios.push_back(fp32_bytes / secs[rep] / tcp[rep]);
  }
  auto tcp_bw = median(tcp);
  auto wire_bw = wire / median(secs);
  auto effective = fp32_bytes / median(secs);
  std::printf("cluster.weight_sync %s: %.0f MB on the wire, policy (node %s) -> engine (node %s) "
              "over %s, %lld channel(s) opened for %d syncs: %.3f s (median of %d, pause + "
              "transfer + resume; the transfer %.3f s on average), %.2f GB/s on the wire, "
              "%.2f GB/s of fp32 weights | raw TCP %s %.2f GB/s, each sync paired with a TCP transfer: "
              "median ratio %.2f "
              "(wire) %.2f (fp32 weights) | TCP between two buffers of the model's size %.2f GB/s, "
              "ratio %.2f%s\n",
              (dtype + (path.netns.empty() ? "" : " across two network namespaces")).c_str(),
              wire / 1e6, pg.bundles[0].node_id.c_str(),
              pg.bundles[1].node_id.c_str(),
              status["last_sync"]["engines/0"].get<std::string>().c_str(),
              static_cast<long long>(status["gloo_channels_opened"].get<int64_t>()), reps + 1,
              median(secs), reps, transfer, wire_bw / 1e9, effective / 1e9,
              path.netns.empty() ? "loopback" : "over the veth pair", tcp_bw / 1e9,
              median(ratios), median(fp32_ratios), median(tcp_whole) / 1e9,
              wire_bw / median(tcp_whole),
              dtype == "fp32"
                  ? (std::string{" | goal >= 0.8: "} + verdict(median(ratios) >= 0.8)).c_str()
                  : "");
}

/// Delta syncs against full ones on the same pair, each sync after a real training step
/// (AdamW at `lr`): `steps` steps with delta syncs, then `steps` with full ones; the median
/// bytes and time of each. In bf16 the GEMM weights travel as bf16, whose elements a small step
/// often leaves unchanged; in fp32 nearly every element changes, and the delta falls back to
/// full buckets. With `lora_rank` > 0 the policy trains LoRA adapters: its delta syncs send the
/// adapters (the engine merges them), its full ones the merged weights.
void weight_sync_delta(test_driver& d, const std::string& dtype, double lr, int steps,
                       int64_t lora_rank = 0) {
  sync_pair pair{d, dtype, lora_rank};
  auto delta = [&](bool on) {
    auto ok = pair.client->set_weight_delta(on);
    if (!ok)
      die("set_weight_delta: " + d.sys().render(ok.error()));
  };
  delta(true);
  pair.sync(); // the channel's first sync is whole: the base of the next
  std::vector<double> delta_secs, full_secs, delta_bytes, full_bytes;
  uint64_t seed = 1;
  for (int i = 0; i < steps; ++i) {
    pair.train_step(lr, seed++);
    auto [secs, bytes] = pair.sync();
    delta_secs.push_back(secs);
    delta_bytes.push_back(static_cast<double>(bytes));
  }
  delta(false);
  for (int i = 0; i < steps; ++i) {
    pair.train_step(lr, seed++);
    auto [secs, bytes] = pair.sync();
    full_secs.push_back(secs);
    full_bytes.push_back(static_cast<double>(bytes));
  }
  std::printf("cluster.weight_sync delta %s%s, a training step (AdamW lr %g) before each sync: "
              "%.2f MB per sync (median of %d; min %.2f, max %.2f) in %.3f s vs full %.2f MB in "
              "%.3f s | bytes ratio %.3f, time ratio %.2f\n",
              dtype.c_str(),
              lora_rank > 0 ? (" LoRA rank " + std::to_string(lora_rank)).c_str() : "", lr,
              median(delta_bytes) / 1e6, steps,
              *std::min_element(delta_bytes.begin(), delta_bytes.end()) / 1e6,
              *std::max_element(delta_bytes.begin(), delta_bytes.end()) / 1e6, median(delta_secs),
              median(full_bytes) / 1e6, median(full_secs),
              median(delta_bytes) / median(full_bytes), median(delta_secs) / median(full_secs));
}

void death_detection(test_cluster& c, test_driver& d) {
  const std::vector<std::string> defaults{"--heartbeat-ms", "200", "--dead-after-ms", "1000"};
  for (int sig : {SIGKILL, SIGSTOP}) {
    std::vector<double> secs;
    for (int rep = 0; rep < 3; ++rep) {
      auto id = std::string{sig == SIGKILL ? "killed" : "stopped"} + std::to_string(rep);
      auto& node = c.add_node(id, 1, 1, defaults);
      if (!node.wait_for_log("joined cluster", 1ms))
        die("node " + id + " did not join:\n" + node.log());
      std::this_thread::sleep_for(300ms);
      auto t0 = clock_type::now();
      node.signal(sig);
      double latency = -1;
      while (latency < 0 && seconds_since(t0) < 30) {
        auto s = d.status();
        if (node_status(s, id)["alive"] == false)
          latency = seconds_since(t0);
        else
          std::this_thread::sleep_for(10ms);
      }
      node.kill();
      c.drop_node(id);
      if (latency < 0)
        die("node " + id + " was not declared dead within 30 s");
      secs.push_back(latency);
    }
    auto m = median(secs);
    std::printf("cluster.death_detection %s: %.2f s (median of 3; max %.2f) | Ray ~15-30 s | "
                "goal <= 2 s: %s\n",
                sig == SIGKILL ? "SIGKILL" : "SIGSTOP", m,
                *std::max_element(secs.begin(), secs.end()), verdict(m <= 2.0));
  }
}

/// CPU seconds process `pid` has used so far: the sum over its threads of the time on a CPU
/// the scheduler counted (/proc/PID/task/TID/schedstat, in nanoseconds; clock ticks are too
/// coarse for a head that is mostly idle).
double cpu_seconds(pid_t pid) {
  double ns = 0;
  std::error_code ec;
  auto dir = "/proc/" + std::to_string(pid) + "/task";
  for (std::filesystem::directory_iterator i{dir, ec}, end; !ec && i != end; i.increment(ec)) {
    std::ifstream in{i->path() / "schedstat"};
    double on_cpu = 0;
    if (in >> on_cpu)
      ns += on_cpu;
  }
  return ns / 1e9;
}

/// How the head's work and the spawn rate grow with the number of nodes: for 1, 2, 4 and 8
/// node processes (rlforge's default heartbeats: every 200 ms), the head's CPU over an idle
/// window with a driver attached, per node per second; and the remote spawn rate of groups of
/// 16 ranks spread over every node.
void scale(bool quick) {
  std::printf("cluster.scale nodes | head CPU per node per second (idle, heartbeats every 200 ms) "
              "| spawn rate, groups of 16 ranks over every node (median of 3)\n");
  const double window = quick ? 2.0 : 5.0;
  std::vector<std::pair<int, double>> totals; // nodes, head CPU seconds per second
  for (int n : {1, 2, 4, 8}) {
    const std::vector<std::string> beats{"--heartbeat-ms", "200", "--dead-after-ms", "1000"};
    test_cluster cluster{"scale" + std::to_string(n), beats};
    for (int i = 1; i <= n; ++i)
      cluster.add_node("n" + std::to_string(i), 1, 16, beats);
    test_driver d{cluster.endpoint(), beats};
    if (!d.error().empty())
      die("attach: " + d.error() + "\n" + cluster.logs());
    std::this_thread::sleep_for(1s); // joins and the first status settle
    auto cpu0 = cpu_seconds(cluster.head().pid());
    auto t0 = clock_type::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(window));
    auto total = (cpu_seconds(cluster.head().pid()) - cpu0) / seconds_since(t0);
    auto per_node = total / n;
    totals.emplace_back(n, total);
    auto pg = or_die(d.pgs().create({"spawn", std::vector<resource_amounts>(n, {{"CPU", 1}}),
                                     "spread", 10}),
                     d.sys(), "create spawn group");
    const int groups = quick ? 2 : 8, per_group = 16;
    auto rate = spawn_rate_on(d, pg, groups, per_group);
    std::printf("cluster.scale %d | %.3f ms CPU per node per second (head total %.3f ms/s) | "
                "%.0f ranks/s (%d ranks)\n",
                n, per_node * 1e3, total * 1e3, rate,
                groups * per_group);
    d.pgs().remove("spawn");
  }
  // Least squares of total = fixed + marginal * nodes: the marginal cost is what 1,000 nodes
  // multiply.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto& [n, y] : totals) {
    sx += n;
    sy += y;
    sxx += static_cast<double>(n) * n;
    sxy += n * y;
  }
  const double k = static_cast<double>(totals.size());
  const double marginal = (k * sxy - sx * sy) / (k * sxx - sx * sx);
  const double fixed = (sy - marginal * sx) / k;
  std::printf("cluster.scale fit: head CPU = %.3f ms/s + %.3f ms/s per node | 1,000 nodes at "
              "200 ms heartbeats: %.0f %% of a core (at 1 s heartbeats: %.0f %%)\n",
              fixed * 1e3, marginal * 1e3, (fixed + 1000 * marginal) * 100,
              (fixed + 200 * marginal) * 100);
}

double grpo_step_time(const std::vector<std::string>& extra, const std::string& dir,
                      const std::string& tag) {
  std::vector<std::string> argv{grpo_example_binary(), "--layout", "split", "--steps", "20",
                                "--held-out", "50", "--quiet", "--metrics",
                                dir + "/" + tag + ".jsonl", "--plot", dir + "/" + tag + ".png"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  child_process job(argv, dir + "/" + tag + ".log", {{"OMP_WAIT_POLICY", "PASSIVE"}});
  if (job.wait_exit(600s) != 0)
    die("grpo (" + tag + ") failed:\n" + job.log());
  auto s = word_after(job.log(), "steps) ");
  if (s.empty())
    die("grpo (" + tag + ") printed no step time:\n" + job.log());
  return std::atof(s.c_str());
}

} // namespace

/// The fp32 weight sync with the engine's node in a network namespace of its own (a veth pair
/// between them, as between two hosts), paired with raw TCP over the same veth pair. Needs
/// root and `ip`; says why it is skipped otherwise.
void weight_sync_across_namespaces() {
  if (auto missing = missing_requirement(); !missing.empty()) {
    std::printf("cluster.weight_sync across two network namespaces: skipped (needs %s)\n",
                missing.c_str());
    return;
  }
  network_namespace ns{2};
  if (!ns.ok) {
    std::printf("cluster.weight_sync across two network namespaces: skipped (could not create "
                "network namespace %s with its veth pair)\n",
                ns.name.c_str());
    return;
  }
  const std::vector<std::string> beats{"--heartbeat-ms", "200", "--dead-after-ms", "1000"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), beats.begin(), beats.end());
    return args;
  };
  test_cluster cluster{"bench_netns", with({"--bind", ns.host_ip, "--insecure"})};
  cluster.add_node("n1", 4, 8, with({"--node-ip", ns.host_ip, "--insecure"}));
  cluster.add_node("n2", 4, 8, with({"--node-ip", ns.node_ip, "--insecure"}),
                   {"ip", "netns", "exec", ns.name});
  test_driver driver{cluster.endpoint(), beats};
  if (!driver.error().empty())
    die("attach: " + driver.error() + "\n" + cluster.logs());
  weight_sync(driver, "fp32", {ns.node_ip, ns.name});
}

int main(int argc, char** argv) {
  bool quick = false, scale_only = false, recovery_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string{argv[i]} == "--quick")
      quick = true;
    else if (std::string{argv[i]} == "--scale")
      scale_only = true;
    else if (std::string{argv[i]} == "--recovery")
      recovery_only = true;
    else
      return rlforge::bench::usage_error(prog, std::string{"unknown argument '"} + argv[i] + "'",
                                         "[--quick] [--scale | --recovery]");
  }
  if (scale_only) {
    scale(quick);
    return 0;
  }
  if (recovery_only) {
    rlforge::cluster_bench::recovery(quick ? 1 : 3);
    return 0;
  }
  test_cluster cluster{"bench", {"--heartbeat-ms", "200", "--dead-after-ms", "1000"}};
  cluster.add_node("n1", 4, 8, {"--heartbeat-ms", "200", "--dead-after-ms", "1000"});
  cluster.add_node("n2", 4, 8, {"--heartbeat-ms", "200", "--dead-after-ms", "1000"});
  test_driver driver{cluster.endpoint(), {"--heartbeat-ms", "200", "--dead-after-ms", "1000"}};
  if (!driver.error().empty())
    die("attach: " + driver.error() + "\n" + cluster.logs());
  control_round_trip(driver);
  spawn_rate(driver, quick ? 8 : 32);
  weight_sync(driver, "fp32");
  weight_sync(driver, "bf16");
  weight_sync_delta(driver, "bf16", 1e-5, quick ? 3 : 7);
  weight_sync_delta(driver, "fp32", 1e-5, quick ? 3 : 7);
  weight_sync_delta(driver, "bf16", 1e-4, quick ? 3 : 7, 16);
  weight_sync_across_namespaces();
  death_detection(cluster, driver);
  if (!quick) {
    auto one = grpo_step_time({}, cluster.dir(), "grpo_one_node");
    auto two = grpo_step_time({"--cluster", cluster.endpoint()}, cluster.dir(), "grpo_two_nodes");
    std::printf("cluster.grpo step time (split layout, median of 20 steps): 2 node processes "
                "%.3f s vs embedded on one node %.3f s | overhead ratio %.2f\n",
                two, one, two / one);
  }
  scale(quick);
  rlforge::cluster_bench::recovery(quick ? 1 : 3);
  return 0;
}
