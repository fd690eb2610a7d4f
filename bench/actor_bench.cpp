// The control plane through actors, each figure against its peer measured or published:
//  1. placement groups created + removed through the placement-manager actor (1,000 groups x 4
//     bundles {CPU 1, GPU 1} over 100 simulated nodes of 8 GPUs; at most 100 alive at once),
//     pipelined from an event-based driver and one at a time from a blocking client.
//     Peer: Ray's published 765 create+remove per second (18.9/s in its 1,000-group run);
//     goal 50,000/s.
//  2. rank spawn rate: 1,000 detached ranks in groups of 4 spawned into placement groups,
//     counted when every rank has answered its first call. Peer: Ray's 551 actors/s; goal 5,000/s.
//  3. control-plane round trip: driver -> group of 4 ranks -> gathered reply, empty payload,
//     median microseconds, from the blocking actor_group API and from an event-based driver.
//     Peer: Ray's ~500 us for a 1:1 synchronous actor call; goal <= 50 us.
// Medians of repeated runs.
//
// Usage: actor_bench [repetitions (default 5)] [any rlforge/CAF option]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/actor_kind.hpp"
#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_actor.hpp"
#include "actors/rank_interface.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int node_count = 100;
constexpr int groups_per_run = 1000;
constexpr int live_window = 100;
constexpr int spawn_ranks = 1000;
constexpr int ranks_per_group = 4;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(caf::actor_system& sys, const caf::error& err, const char* what) {
  std::fprintf(stderr, "actor_bench: %s: %s\n", what, sys.render(err).c_str());
  std::exit(1);
}

std::vector<node_resources> simulated_nodes() {
  std::vector<node_resources> nodes;
  for (int i = 0; i < node_count; ++i) {
    node_resources n;
    n.node_id = std::string{"node-"} + (i < 10 ? "00" : "0") + std::to_string(i);
    n.gpus = 8;
    n.cpus = 64;
    nodes.push_back(n);
  }
  return nodes;
}

placement_group_request group_request(int i) {
  static const char* strategies[] = {"pack", "spread", "strict_pack", "strict_spread"};
  placement_group_request r;
  r.name = "g" + std::to_string(i);
  r.strategy = strategies[i % 4];
  r.bundles.assign(4, resource_amounts{{"CPU", 1}, {"GPU", 1}});
  r.timeout_s = 60;
  return r;
}

/// Pipelined create+remove: windows of `live_window` creates in flight, then their removes.
double pipelined_pg_rate(caf::actor_system& sys, const caf::actor& manager) {
  caf::scoped_actor self{sys};
  auto timeout = std::chrono::seconds(60);
  auto start = clock_type::now();
  for (int base = 0; base < groups_per_run; base += live_window) {
    std::vector<decltype(self->request(manager, timeout, pg_create_atom::value,
                                       group_request(0)))> creates;
    for (int i = base; i < base + live_window; ++i)
      creates.push_back(self->request(manager, timeout, pg_create_atom::value, group_request(i)));
    for (auto& h : creates)
      h.receive([&](placement_group_info&) {}, [&](caf::error& e) { die(sys, e, "create"); });
    std::vector<decltype(self->request(manager, timeout, pg_remove_atom::value,
                                       std::string{}))> removes;
    for (int i = base; i < base + live_window; ++i)
      removes.push_back(
        self->request(manager, timeout, pg_remove_atom::value, "g" + std::to_string(i)));
    for (auto& h : removes)
      h.receive([&] {}, [&](caf::error& e) { die(sys, e, "remove"); });
  }
  return groups_per_run / seconds_since(start);
}

double blocking_pg_rate(caf::actor_system& sys, const caf::actor& manager) {
  placement_client client{sys, manager};
  auto start = clock_type::now();
  for (int i = 0; i < groups_per_run; ++i) {
    auto r = client.create(group_request(i));
    if (!r)
      die(sys, r.error(), "create");
    if (auto ok = client.remove(r->name); !ok)
      die(sys, ok.error(), "remove");
  }
  return groups_per_run / seconds_since(start);
}

/// A group of no-op ranks (one per bundle, 1 thread each, no collectives) in `pg`.
group_spec noop_group(const std::string& name, const placement_group_info& pg) {
  group_spec spec;
  spec.name = name;
  spec.kind = "bench.noop";
  spec.placement = pg;
  spec.threads_per_rank = 1;
  spec.collectives = false;
  return spec;
}

double spawn_rate(caf::actor_system& sys, const caf::actor& manager, int rep) {
  placement_client client{sys, manager};
  std::vector<actor_group> groups;
  std::vector<std::string> pgs;
  auto start = clock_type::now();
  for (int g = 0; g < spawn_ranks / ranks_per_group; ++g) {
    auto req = group_request(g);
    req.name = "spawn" + std::to_string(rep) + "-" + std::to_string(g);
    req.strategy = "pack";
    req.bundles.assign(4, resource_amounts{{"CPU", 1}, {"GPU", 0.5}}); // 1,000 ranks: 500 GPUs
    auto pg = client.create(req);
    if (!pg)
      die(sys, pg.error(), "create");
    pgs.push_back(req.name);
    auto group = actor_group::spawn(sys, noop_group(req.name, *pg));
    if (!group)
      die(sys, group.error(), "spawn");
    groups.push_back(*group);
  }
  // Ready = every rank answered a call (its thread runs and its state exists).
  caf::scoped_actor self{sys};
  std::vector<decltype(self->request(groups[0].handle(), std::chrono::seconds(60), all_atom::value,
                                     rank_ops::ping.id, caf::message{}, int64_t{0}))>
      pings;
  for (auto& g : groups)
    pings.push_back(self->request(g.handle(), std::chrono::seconds(60), all_atom::value,
                                  rank_ops::ping.id, caf::message{}, int64_t{60000}));
  for (auto& h : pings)
    h.receive([&](std::vector<caf::message>&) {}, [&](caf::error& e) { die(sys, e, "ping"); });
  double rate = spawn_ranks / seconds_since(start);
  for (auto& g : groups)
    g.stop();
  for (auto& name : pgs)
    client.remove(name);
  return rate;
}

std::vector<double> blocking_round_trips(actor_group& group, int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    auto t = clock_type::now();
    auto r = group.call_all(rank_ops::ping, std::chrono::seconds(10));
    us.push_back(seconds_since(t) * 1e6);
    if (!r) {
      std::fprintf(stderr, "actor_bench: ping failed\n");
      std::exit(1);
    }
  }
  return us;
}

std::vector<double> event_based_round_trips(caf::actor_system& sys, const caf::actor& group,
                                            int n) {
  struct driver_state {
    std::vector<double> us;
    clock_type::time_point sent;
  };
  caf::scoped_actor self{sys};
  auto reply_to = caf::actor_cast<caf::actor>(self);
  std::vector<double> out;
  auto driver = sys.spawn([=](caf::stateful_actor<driver_state>* d) -> caf::behavior {
    auto next = [=] {
      d->state.sent = clock_type::now();
      d->send(group, all_atom::value, rank_ops::ping.id, caf::message{}, int64_t{10000});
    };
    next();
    return {
      [=](std::vector<caf::message>&) {
        d->state.us.push_back(seconds_since(d->state.sent) * 1e6);
        if (static_cast<int>(d->state.us.size()) < n)
          next();
        else
          d->send(reply_to, d->state.us);
      },
    };
  });
  self->receive([&](std::vector<double>& us) { out = std::move(us); });
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  int reps = 5;
  if (argc > 1 && argv[1][0] != '-') {
    reps = std::max(1, std::atoi(argv[1]));
    --argc;
    ++argv;
  }
  runtime::system_config cfg;
  if (auto err = cfg.parse_all(argc, argv)) {
    std::fprintf(stderr, "actor_bench: %s\n", to_string(err).c_str());
    return 2;
  }
  actor_kind noop;
  noop.name = "bench.noop";
  noop.implements<rank_interface<>>();
  register_kind(noop);
  caf::actor_system sys{cfg};
  auto manager = spawn_placement_manager(sys, simulated_nodes(), std::chrono::seconds(60));

  std::vector<double> pipelined, blocking, spawns;
  for (int r = 0; r < reps; ++r) {
    pipelined.push_back(pipelined_pg_rate(sys, manager));
    blocking.push_back(blocking_pg_rate(sys, manager));
  }
  for (int r = 0; r < std::min(reps, 3); ++r)
    spawns.push_back(spawn_rate(sys, manager, r));

  auto pg = placement_client{sys, manager}.create(
    {"rtt", std::vector<resource_amounts>(4, {{"CPU", 1}, {"GPU", 1}}), "pack", 10});
  if (!pg)
    die(sys, pg.error(), "create rtt group");
  auto group = actor_group::spawn(sys, noop_group("rtt", *pg));
  if (!group)
    die(sys, group.error(), "spawn rtt group");
  blocking_round_trips(*group, 200); // warm-up
  auto rtt_blocking = median(blocking_round_trips(*group, 2000));
  auto rtt_event = median(event_based_round_trips(sys, group->handle(), 2000));
  group->stop();

  auto verdict = [](bool met) { return met ? "met" : "NOT met"; };
  double p = median(pipelined), b = median(blocking), s = median(spawns);
  std::printf("placement.actor create+remove (pipelined): %.0f groups/s (median of %d) | vs Ray "
              "765/s: %.0fx | vs Ray 18.9/s (1,000 groups): %.0fx | goal 50000/s: %s\n",
              p, reps, p / 765.0, p / 18.9, verdict(p >= 50000));
  std::printf("placement.actor create+remove (blocking client): %.0f groups/s (median of %d) | "
              "vs Ray 765/s: %.0fx | goal 50000/s: %s\n",
              b, reps, b / 765.0, verdict(b >= 50000));
  std::printf("actors.spawn 1000 detached ranks (groups of 4, until all answered): %.0f ranks/s "
              "(median of %zu) | vs Ray 551/s: %.1fx | goal 5000/s: %s\n",
              s, spawns.size(), s / 551.0, verdict(s >= 5000));
  std::printf("actors.rtt group of 4, empty payload, blocking API: %.1f us (median of 2000) | "
              "vs Ray ~500 us: %.1fx faster | goal <= 50 us: %s\n",
              rtt_blocking, 500.0 / rtt_blocking, verdict(rtt_blocking <= 50));
  std::printf("actors.rtt group of 4, empty payload, event-based driver: %.1f us (median of "
              "2000) | vs Ray ~500 us: %.1fx faster | goal <= 50 us: %s\n",
              rtt_event, 500.0 / rtt_event, verdict(rtt_event <= 50));
  caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);
  return 0;
}
