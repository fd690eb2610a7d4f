// Placing a lost placement group again with its actor groups (group_replacement.hpp).
#include "examples/grpo/group_replacement.hpp"

#include <chrono>

#include <caf/all.hpp>

#include "runtime/errc.hpp"

#include "../common/driver.hpp"

namespace rlforge::examples::grpo {

caf::expected<replaced_groups> replace_groups(
    const fatal_errors& or_die, actors::placement_client& pgs, const std::string& pg_name,
    const resource_amounts& bundle,
    const std::function<std::vector<actors::group_spec>(const placement_group_info&)>& specs,
    double timeout_s, const std::string& what) {
  auto& sys = or_die.sys;
  replaced_groups out;
  // Spawns the groups on the placed group; a spawn that fails (on the lost node, before the
  // head declared it dead) stops the ones spawned, and the group is placed again.
  auto spawn_all = [&](const placement_group_info& pg) -> std::string {
    out.groups.clear();
    out.node = pg.bundles.at(0).node_id;
    for (const auto& spec : specs(pg)) {
      auto group = actors::actor_group::spawn(sys, spec);
      if (!group) {
        for (auto& g : out.groups)
          g.stop();
        out.groups.clear();
        return "spawning group '" + spec.name + "' on node '" + out.node +
               "': " + sys.render(group.error());
      }
      or_die.stops->add([g = *group]() mutable { g.stop(); });
      out.groups.push_back(*group);
    }
    return {};
  };
  const auto timeout = std::chrono::milliseconds{static_cast<int64_t>(timeout_s * 1000)};
  auto placed = pgs.place_again({pg_name, {bundle}, "pack", timeout_s}, timeout, spawn_all);
  if (!placed)
    return make_error(errc::timeout, what + " within " +
                                         std::to_string(static_cast<int>(timeout_s)) +
                                         " s (--recovery-timeout); last: " +
                                         error_message(placed.error()));
  return out;
}

} // namespace rlforge::examples::grpo
