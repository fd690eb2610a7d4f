#include "examples/grpo/engine_recovery.hpp"

#include <caf/all.hpp>

#include "actors/engine.hpp"
#include "runtime/errc.hpp"

#include "../common/driver.hpp"

namespace rlforge::examples::grpo {

engine_recovery::engine_recovery(const fatal_errors& or_die, actors::placement_client& pgs,
                                 caf::actor manager, actors::actor_group& engines,
                                 model_spec model, const options& opt, restart_budget& budget)
    : or_die_(or_die), pgs_(pgs), manager_(std::move(manager)),
      engines_(engines), model_(std::move(model)), timeout_s_(opt.recovery_timeout),
      budget_(budget) {
}

bool engine_recovery::engines_lost(std::chrono::milliseconds patience) {
  return !engines_.call_all(actors::engine_ops::weight_version, patience);
}

caf::expected<std::string> engine_recovery::replace(actors::trainer_client& client) {
  ++budget_.used;
  auto& sys = or_die_.sys;
  engines_.stop();
  auto placed = replace_groups(
      or_die_, pgs_, split_layout::generation, split_layout::bundle(),
      [&](const placement_group_info& pg) {
        return std::vector<actors::group_spec>{role_group_spec(
            manager_, pg, "engines", "engine", false, split_layout::engine_gpu_per_rank)};
      },
      timeout_s_, "engine recovery: no engines");
  if (!placed)
    return std::move(placed.error());
  engines_ = placed->groups.at(0);
  if (auto n = client.register_engines(engines_); !n)
    return make_error(errc::rank_failed,
                      "engine recovery: registering the engines: " + sys.render(n.error()));
  if (auto n = client.init_model("engines", model_); !n)
    return make_error(errc::rank_failed,
                      "engine recovery: initializing the engines: " + sys.render(n.error()));
  return placed->node;
}

} // namespace rlforge::examples::grpo
