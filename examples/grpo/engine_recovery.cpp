#include "examples/grpo/engine_recovery.hpp"

#include <algorithm>
#include <thread>

#include <caf/all.hpp>

#include "runtime/errc.hpp"

#include "../common/driver.hpp"

namespace rlforge::examples::grpo {

engine_recovery::engine_recovery(const fatal_errors& or_die, actors::trainer_client& client,
                                 actors::placement_client& pgs, caf::actor manager,
                                 actors::actor_group& engines, model_spec model,
                                 const options& opt)
    : or_die_(or_die), client_(client), pgs_(pgs), manager_(std::move(manager)),
      engines_(engines), model_(std::move(model)), max_restarts_(opt.max_restarts),
      timeout_s_(opt.recovery_timeout) {
}

bool engine_recovery::engines_lost(std::chrono::milliseconds patience) {
  return !engines_.call_all("weight_version", caf::message{}, patience);
}

caf::expected<std::string> engine_recovery::replace() {
  ++restarts_;
  auto& sys = or_die_.sys;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds{static_cast<int64_t>(timeout_s_ * 1000)};
  auto left_s = [&] {
    return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  };
  engines_.stop();
  // The head may still count the lost node as alive for a moment (it declares a hung node
  // dead after --dead-after-ms): a group placed there fails to spawn and is placed again.
  std::string why = "no attempt";
  while (left_s() > 0) {
    (void)pgs_.remove(split_engines::placement_group); // failed with the node, or gone
    auto pg = pgs_.create({split_engines::placement_group, {split_engines::bundle()}, "pack",
                           std::max(left_s(), 0.1)});
    if (!pg) {
      why = "no room for the engines: " + sys.render(pg.error());
      continue;
    }
    auto group = actors::actor_group::spawn(
        sys, role_group_spec(manager_, *pg, "engines", "engine", false,
                             split_engines::gpu_per_rank));
    if (!group) {
      why = "spawning the engines on node '" + pg->bundles.at(0).node_id +
            "': " + sys.render(group.error());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    or_die_.stops->add([g = *group]() mutable { g.stop(); });
    engines_ = *group;
    if (auto n = client_.register_engines(engines_); !n)
      return make_error(errc::rank_failed, "engine recovery: registering the engines: " +
                                               sys.render(n.error()));
    if (auto n = client_.init_model("engines", model_); !n)
      return make_error(errc::rank_failed, "engine recovery: initializing the engines: " +
                                               sys.render(n.error()));
    return pg->bundles.at(0).node_id;
  }
  return make_error(errc::timeout, "engine recovery: no engines within " +
                                       std::to_string(static_cast<int>(timeout_s_)) +
                                       " s (--recovery-timeout); last: " + why);
}

} // namespace rlforge::examples::grpo
