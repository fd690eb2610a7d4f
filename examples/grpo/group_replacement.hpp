#pragma once
// What the GRPO job's start and its recoveries share (engine_recovery.hpp,
// trainer_recovery.hpp): where placement "split" puts each role, the budget of restarts
// (--max-restarts) and placing a lost placement group again with its actor groups. Driver's main
// thread only.
#include <functional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/actor_group.hpp"
#include "actors/placement_manager.hpp"

namespace rlforge::examples {
struct fatal_errors;
}

namespace rlforge::examples::grpo {

/// Where placement "split" puts each role: two placement groups of one bundle each, "training"
/// (the policy's rank and the reference's, at half of its GPU each) and "generation" (one
/// engine rank holding all of it). The job places them so at start, a recovery again.
struct split_layout {
  static constexpr const char* training = "training";
  static constexpr const char* generation = "generation";
  static constexpr double trainer_gpu_per_rank = 0.5;
  static constexpr double engine_gpu_per_rank = 1.0;
  /// The bundle of either placement group.
  static resource_amounts bundle() { return {{"GPU", 1.0}, {"CPU", 1.0}}; }
};

/// How many losses the job may still recover from, shared by both recoveries: each
/// replacement, successful or not, spends one.
struct restart_budget {
  int max = 0;  ///< --max-restarts
  int used = 0; ///< replacements tried so far

  /// True while another replacement is allowed.
  bool can_restart() const { return used < max; }
};

/// The groups a replaced placement group holds now, and the node of its first bundle.
struct replaced_groups {
  std::vector<actors::actor_group> groups; ///< in the order `specs` gave them
  std::string node;
};

/// Places placement group `pg_name` (one bundle of `bundle`, packed) again and spawns the groups
/// `specs` describes in it, in order; the lost groups must be stopped already. The head may
/// still count a lost node as alive for a moment (it declares a hung node dead after
/// --dead-after-ms): groups placed there fail to spawn, are stopped, and the placement group is
/// placed again (`placement_client::place_again`), until `timeout_s` has passed. Every group
/// spawned is stopped on the job's failure paths (`or_die.stops`). The timeout's error is
/// "<what> within N s (--recovery-timeout); last: <the last attempt's failure>".
caf::expected<replaced_groups> replace_groups(
    const fatal_errors& or_die, actors::placement_client& pgs, const std::string& pg_name,
    const resource_amounts& bundle,
    const std::function<std::vector<actors::group_spec>(const placement_group_info&)>& specs,
    double timeout_s, const std::string& what);

} // namespace rlforge::examples::grpo
