// Placing a lost placement group again with its actor groups (group_replacement.hpp).
#include "examples/grpo/group_replacement.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

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
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds{static_cast<int64_t>(timeout_s * 1000)};
  auto left_s = [&] {
    return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  };
  std::string why = "no attempt";
  while (left_s() > 0) {
    (void)pgs.remove(pg_name); // failed with the node, or gone
    auto pg = pgs.create({pg_name, {bundle}, "pack", std::max(left_s(), 0.1)});
    if (!pg) {
      why = "no room: " + sys.render(pg.error());
      continue;
    }
    replaced_groups out;
    out.node = pg->bundles.at(0).node_id;
    const auto wanted = specs(*pg);
    for (const auto& spec : wanted) {
      auto group = actors::actor_group::spawn(sys, spec);
      if (!group) {
        why = "spawning group '" + spec.name + "' on node '" + out.node +
              "': " + sys.render(group.error());
        break;
      }
      or_die.stops->add([g = *group]() mutable { g.stop(); });
      out.groups.push_back(*group);
    }
    if (out.groups.size() == wanted.size())
      return out;
    for (auto& g : out.groups)
      g.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return make_error(errc::timeout, what + " within " +
                                       std::to_string(static_cast<int>(timeout_s)) +
                                       " s (--recovery-timeout); last: " + why);
}

} // namespace rlforge::examples::grpo
