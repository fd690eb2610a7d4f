// Throughput of the pure placement scheduler and of placement_table: create + remove of
// placement groups of 4 bundles {CPU: 1, GPU: 1} on 100 simulated nodes of 8 GPUs and 64 CPUs.
// Prints medians of repeated runs and the ratio to Ray's published placement-group figures
// (765 create+remove per second; 18.9 per second in its 1,000-group run) and to our goal.
//
// The machine may be shared: each figure is the median over repetitions of the wall-clock rate,
// and the line also gives the median rate in thread CPU time, which other processes disturb
// less.
//
// Usage: placement_bench [repetitions (default 9)] [groups per run (default 1000)]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <string>
#include <vector>

#include "placement/scheduler.hpp"
#include "placement/table.hpp"

namespace {

using namespace rlforge::placement;
using clock_type = std::chrono::steady_clock;

constexpr double ray_rate = 765.0;
constexpr double ray_1000_rate = 18.9;
constexpr double goal_rate = 50000.0;
constexpr std::size_t node_count = 100;
constexpr int gpus_per_node = 8;
constexpr double cpus_per_node = 64;
constexpr std::size_t live_window = 100; // groups alive at once: 400 of the 800 GPUs

const std::vector<placement_strategy> all_strategies{
    placement_strategy::pack, placement_strategy::spread, placement_strategy::strict_pack,
    placement_strategy::strict_spread};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "placement_bench: %s\n", what.c_str());
  std::exit(1);
}

placement_table make_table() {
  placement_table t;
  for (std::size_t i = 0; i < node_count; ++i) {
    auto node = make_node("node-" + std::to_string(i), gpus_per_node, cpus_per_node);
    if (!node)
      die(node.error().message);
    if (auto ok = t.add_node(*node); !ok)
      die(ok.error().message);
  }
  return t;
}

placement_request make_group_request(placement_strategy s) {
  auto bundle = make_resources({{"CPU", 1}, {"GPU", 1}});
  if (!bundle)
    die(bundle.error().message);
  return placement_request{s, std::vector<resource_set>(4, *bundle)};
}

/// Seconds of CPU time used by this thread.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// Wall-clock and CPU-time rates of one run.
struct rates {
  double wall = 0;
  double cpu = 0;
};

/// Times `body` and turns `count` operations into rates.
template <class F> rates timed(std::size_t count, F&& body) {
  auto cpu_start = thread_cpu_seconds();
  auto start = clock_type::now();
  body();
  std::chrono::duration<double> elapsed = clock_type::now() - start;
  auto cpu = thread_cpu_seconds() - cpu_start;
  auto n = static_cast<double>(count);
  return rates{n / elapsed.count(), n / std::max(cpu, 1e-9)};
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  auto n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

/// One run: `groups` creates and as many removes with at most `live_window` groups alive,
/// strategies taken round-robin from `strategies`. Returns create+remove pairs per second.
rates table_run(std::size_t groups, const std::vector<placement_strategy>& strategies) {
  auto table = make_table();
  std::vector<placement_request> requests;
  for (auto s : strategies)
    requests.push_back(make_group_request(s));
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < groups; ++i)
    ids.push_back("pg-" + std::to_string(i));
  std::deque<std::size_t> live;
  auto rate = timed(groups, [&] {
    for (std::size_t i = 0; i < groups; ++i) {
      auto r = table.create(ids[i], requests[i % requests.size()]);
      if (!r.placed())
        die("group " + ids[i] + " was not placed: " + r.reason);
      live.push_back(i);
      if (live.size() > live_window) {
        if (!table.remove(ids[live.front()]))
          die("remove failed");
        live.pop_front();
      }
    }
    while (!live.empty()) {
      if (!table.remove(ids[live.front()]))
        die("remove failed");
      live.pop_front();
    }
  });
  if (table.cluster().group_count() != 0)
    die("groups left behind");
  return rate;
}

/// Pure `schedule()` calls per second on a cluster half full of groups of mixed strategies.
rates schedule_run(std::size_t calls) {
  auto table = make_table();
  for (std::size_t i = 0; i < node_count; ++i) {
    auto r = table.create("fill-" + std::to_string(i),
                          make_group_request(all_strategies[i % all_strategies.size()]));
    if (!r.placed())
      die("fill group not placed: " + r.reason);
  }
  std::vector<placement_request> requests;
  for (auto s : all_strategies)
    requests.push_back(make_group_request(s));
  std::size_t placed = 0;
  auto rate = timed(calls, [&] {
    for (std::size_t i = 0; i < calls; ++i)
      placed += schedule(table.cluster(), requests[i % requests.size()]).placed() ? 1 : 0;
  });
  if (placed != calls)
    die("a schedule() call did not place");
  return rate;
}

template <class F> rates median_of(int reps, F&& run) {
  std::vector<double> wall;
  std::vector<double> cpu;
  for (int r = 0; r < reps; ++r) {
    auto x = run();
    wall.push_back(x.wall);
    cpu.push_back(x.cpu);
  }
  return rates{median(wall), median(cpu)};
}

void print_table_line(const std::string& name, rates r, int reps) {
  std::printf("%s: %.0f groups/s (median of %d) | vs Ray %.0f/s: %.0fx | vs Ray 1000-group run "
              "%.1f/s: %.0fx | goal %.0f/s: %s | cpu-time rate %.0f groups/s\n",
              name.c_str(), r.wall, reps, ray_rate, r.wall / ray_rate, ray_1000_rate,
              r.wall / ray_1000_rate, goal_rate, r.wall >= goal_rate ? "met" : "NOT met", r.cpu);
}

} // namespace

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  long groups_arg = argc > 2 ? std::atol(argv[2]) : 1000;
  if (reps < 1 || groups_arg < 1)
    die("usage: placement_bench [repetitions >= 1] [groups >= 1]");
  auto groups = static_cast<std::size_t>(groups_arg);
  std::printf("cluster: %zu nodes x %d GPUs, %.0f CPUs; groups of 4 bundles {CPU: 1, GPU: 1}; "
              "%zu groups per run, at most %zu alive\n",
              node_count, gpus_per_node, cpus_per_node, groups, live_window);
  // Warm-up run so that allocator state and caches do not favour later figures.
  table_run(groups, all_strategies);
  print_table_line("placement.table create+remove (mixed strategies)",
                   median_of(reps, [&] { return table_run(groups, all_strategies); }), reps);
  for (auto s : all_strategies)
    print_table_line(std::string("placement.table create+remove (") + to_string(s) + ")",
                     median_of(reps, [&] { return table_run(groups, {s}); }), reps);
  auto calls = groups * 4;
  auto rate = median_of(reps, [&] { return schedule_run(calls); });
  std::printf("placement.schedule on a half-full cluster: %.0f calls/s (median of %d) | vs Ray "
              "create+remove %.0f/s: %.0fx | goal %.0f/s: %s | cpu-time rate %.0f calls/s\n",
              rate.wall, reps, ray_rate, rate.wall / ray_rate, goal_rate,
              rate.wall >= goal_rate ? "met" : "NOT met", rate.cpu);
  return 0;
}
