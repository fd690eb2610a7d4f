#pragma once
// What the sections of cluster_bench (cluster_bench.cpp, cluster_recovery_bench.cpp) share:
// failing loudly, the verdict text, spawning a group on a test cluster. Single-threaded use from
// the bench's main thread.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "tests/cluster/cluster_fixture.hpp"

namespace rlforge::cluster_bench {

using namespace rlforge::actors;
using namespace rlforge::cluster_test;

inline const char* prog = "cluster_bench";

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", prog, what.c_str());
  std::exit(1);
}

template <class T>
T or_die(caf::expected<T> x, caf::actor_system& sys, const char* what) {
  if (!x)
    die(std::string{what} + ": " + sys.render(x.error()));
  return std::move(*x);
}

inline const char* verdict(bool met) {
  return met ? "met" : "not met";
}

inline actor_group spawn_group(test_driver& d, const std::string& name, const std::string& kind,
                        const placement_group_info& pg, int ranks, bool collectives = false) {
  group_spec spec;
  spec.name = name;
  spec.kind = kind;
  spec.placement = pg;
  spec.num_ranks = ranks;
  spec.threads_per_rank = 1;
  spec.collectives = collectives;
  return or_die(actor_group::spawn(d.sys(), spec), d.sys(), "spawn group");
}

/// Section 7 (cluster_recovery_bench.cpp): time to recover on the GRPO job and `rlforge serve`
/// after a node is lost, then a head restarted from its state file; medians of `reps` runs.
void recovery(int reps);

} // namespace rlforge::cluster_bench
