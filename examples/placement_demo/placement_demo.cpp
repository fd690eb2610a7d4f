// The placement demo: on one node with virtual GPUs (4 unless --gpus says otherwise), create a
// placement group with each strategy, spawn an actor group of 5 ranks at 0.2 GPU each into one
// bundle, run a mesh call (each rank squares its chunk of a batch) and an all-reduce of the
// partial sums, check the result against a direct computation, and print the placement table.
//
//   placement_demo [--gpus N] [--cpus N] [any CAF option]   (--help lists them)
#include <cstdio>
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "../common/driver.hpp"
#include "actors/actor_group.hpp"
#include "actors/actor_kind.hpp"
#include "actors/node.hpp"
#include "actors/placement_manager.hpp"
#include "actors/rank_actor.hpp"
#include "actors/rank_interface.hpp"
#include "actors/tensor_convert.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;

namespace {

/// A demo rank's op: `sum_squares` takes a chunk of a batch and returns the sum of its squares.
constexpr op_ref<tensor_list(tensor_list)> sum_squares_op{"sum_squares", caf::atom("sum_sq")};

void register_demo_kind() {
  actor_kind k;
  k.name = "demo.worker";
  k.implements<rank_interface<sum_squares_op>>();
  k.add(context_op(sum_squares_op,
                   +[](rank_context&, const tensor_list& in) -> caf::expected<tensor_list> {
                     if (in.empty())
                       return make_error(errc::invalid_argument, "sum_squares: no tensor");
                     auto chunk = from_blob(in.front());
                     if (!chunk)
                       return std::move(chunk.error());
                     auto partial = chunk->pow(2).sum().reshape({1});
                     auto blob = to_blob(partial);
                     if (!blob)
                       return std::move(blob.error());
                     return tensor_list{std::move(*blob)};
                   },
                   {"chunk"}));
  register_kind(std::move(k));
}

template <class T>
T or_die(caf::actor_system& sys, caf::expected<T> x, const char* what) {
  return examples::fatal_errors{"placement_demo", sys}(std::move(x), what);
}

void or_die(caf::actor_system& sys, caf::expected<void> x, const char* what) {
  examples::fatal_errors{"placement_demo", sys}(std::move(x), what);
}

void print_group(const placement_group_info& pg) {
  std::printf("  %-14s %-13s", pg.name.c_str(), pg.strategy.c_str());
  for (auto& b : pg.bundles) {
    std::string devices;
    for (auto d : b.device_ids)
      devices += (devices.empty() ? "" : ",") + std::to_string(d);
    std::printf(" [bundle %u -> %s gpu %s]", b.bundle_index, b.node_id.c_str(), devices.c_str());
  }
  std::printf("\n");
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"", "placement_demo"};
  examples::describe(app,
                     "On one node with virtual GPUs, creates a placement group with each "
                     "strategy,\nspawns 5 ranks at 0.2 GPU each into one bundle, runs a mesh call "
                     "and an all-reduce\nand checks them against a direct computation. Other "
                     "arguments go to CAF and\nrlforge's system configuration (e.g. "
                     "--scheduler.max-threads=2).",
                     "  placement_demo --gpus 4");
  app.allow_extras();
  int gpus = 4;
  int cpus = 0;
  app.add_option("--gpus", gpus, "virtual GPUs of the node (1..1024)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024).description(""))
      ->type_name("N");
  app.add_option("--cpus", cpus, "CPUs the node offers (0 = what the machine has)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096).description(""))
      ->type_name("N");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "placement_demo: " << e.what() << " (see placement_demo --help)\n";
    return 2;
  }
  runtime::system_config cfg;
  cfg.gpus = gpus;
  if (auto err = cfg.parse_args(app.remaining())) {
    std::cerr << "placement_demo: " << to_string(err) << "\n";
    return 2;
  }
  // The flags win over the environment (RLFORGE_GPUS, RLFORGE_CPUS).
  if (app.count("--gpus"))
    cfg.gpus = gpus;
  if (app.count("--cpus"))
    cfg.cpus = cpus;
  register_demo_kind();
  runtime::block_stop_signals(); // run_driver takes SIGINT/SIGTERM as requests to stop
  caf::actor_system sys{cfg};
  examples::fatal_errors die{"placement_demo", sys};
  return examples::run_driver(die, [&]() -> int {
    auto node = local_node(cfg);
    std::printf("node %s: %d CPUs, %.1f GiB, %d virtual GPUs\n\n", node.node_id.c_str(), node.cpus,
                static_cast<double>(node.memory_bytes) / (1 << 30), node.gpus);
    auto manager = spawn_placement_manager(
        sys, {node}, std::chrono::milliseconds{static_cast<int64_t>(cfg.pg_timeout_s * 1000)});
    die.stops->add(
        [manager] { caf::anon_send_exit(manager, caf::exit_reason::user_shutdown); });
    placement_client pgs{sys, manager};

    std::printf("placement groups, one per strategy:\n");
    auto one_gpu = resource_amounts{{"GPU", 1}, {"CPU", 0.25}};
    print_group(or_die(sys, pgs.create({"pack", {one_gpu, one_gpu}, "pack", 5}), "pack"));
    print_group(or_die(sys, pgs.create({"spread", {one_gpu}, "spread", 5}), "spread"));
    print_group(
        or_die(sys, pgs.create({"strict_pack", {{{"GPU", 0.5}}, {{"GPU", 0.5}}}, "strict_pack", 5}),
               "strict_pack"));
    // strict_spread needs one node per bundle: two bundles on one node can never be placed.
    auto infeasible = pgs.create({"strict_spread", {one_gpu, one_gpu}, "strict_spread", 5});
    std::printf("  %-14s %-13s %s\n", "strict_spread", "(2 bundles)",
                infeasible ? "placed?!" : sys.render(infeasible.error()).c_str());
    for (auto name : {"pack", "spread", "strict_pack"})
      or_die(sys, pgs.remove(name), "remove");

    std::printf("\nactor group: 5 ranks x 0.2 GPU colocated in one bundle\n");
    auto pg = or_die(sys, pgs.create({"colocated", {{{"GPU", 1}, {"CPU", 2}}}, "strict_pack", 5}),
                     "create colocated");
    group_spec spec;
    spec.name = "workers";
    spec.kind = "demo.worker";
    spec.placement = pg;
    spec.num_ranks = 5;
    spec.gpu_per_rank = 0.2;
    spec.threads_per_rank = 1;
    spec.placement_manager = manager;
    auto group = die.group(actor_group::spawn(sys, spec), "spawn group");
    for (auto& r : or_die(sys, group.ranks(), "ranks"))
      std::printf("  rank %d/%d on %s gpu %d (%.1f of it, virtual), %d torch thread(s)\n", r.rank,
                  r.world_size, r.node_id.c_str(), r.device_ids.at(0), r.gpu_fraction, r.threads);

    auto batch = at::arange(1, 101, at::kFloat); // 1..100
    std::vector<caf::message> chunks;
    for (auto& c : batch.chunk(5))
      chunks.push_back(sum_squares_op.args(tensor_list{or_die(sys, to_blob(c), "to_blob")}));
    auto partials = or_die(sys, group.call_mesh(sum_squares_op, chunks, 30s), "mesh call");
    std::printf("\nmesh call: partial sums of squares by rank:");
    std::vector<caf::message> reduce_in;
    for (auto& p : partials) {
      auto t = or_die(sys, from_blob(p.at(0)), "from_blob");
      std::printf(" %.0f", t.item<float>());
      reduce_in.push_back(rank_ops::all_reduce.args(p));
    }
    auto reduced = or_die(sys, group.call_mesh(rank_ops::all_reduce, reduce_in, 30s), "all-reduce");
    double expected = batch.pow(2).sum().item<double>();
    bool all_equal = true;
    std::printf("\nall-reduce (Gloo) by rank:");
    for (auto& r : reduced) {
      auto t = or_die(sys, from_blob(r.at(0)), "from_blob");
      std::printf(" %.0f", t.item<double>());
      all_equal = all_equal && t.item<double>() == expected;
    }
    std::printf("; direct computation: %.0f -> %s\n", expected, all_equal ? "ok" : "MISMATCH");

    std::printf("\nplacement table:\n%s\n", or_die(sys, pgs.table(), "table").c_str());
    group.stop();
    caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);
    return all_equal ? 0 : 1;
  });
}
