#include "actors/tinker_healing.hpp"

#include <algorithm>

#include <caf/all.hpp>

#include "actors/placement_manager.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "tinker/error.hpp"

namespace rlforge::actors {

namespace {

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v)
    out += (out.empty() ? "" : "; ") + s;
  return out;
}

} // namespace

std::string node_of(actor_group& g) {
  auto infos = g.ranks();
  return infos && !infos->empty() ? infos->front().node_id : std::string{};
}

tinker_healing::tinker_healing(tinker_groups& groups) : groups_(groups) {}

bool tinker_healing::enabled() const {
  return groups_.options().max_restarts > 0;
}

bool tinker_healing::lost(actor_group& g) const {
  if (!g.handle())
    return true;
  auto handles = g.rank_handles();
  if (!handles)
    return true;
  std::vector<caf::actor> watched = *handles;
  watched.push_back(g.handle());
  caf::scoped_actor self{groups_.system()};
  for (auto& a : watched)
    self->monitor(a);
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; },
                caf::after(std::chrono::milliseconds(200)) >> [] {});
  for (auto& a : watched)
    self->demonitor(a);
  return down;
}

void tinker_healing::heal(uint64_t generation, const std::string& node,
                          const std::string& seen_by) {
  std::lock_guard<std::mutex> guard(heal_mutex_);
  auto [current, current_generation] = groups_.placement();
  if (current_generation > generation)
    return; // healed already, by the call that saw it first
  const auto& o = groups_.options();
  const auto t0 = std::chrono::steady_clock::now();
  auto where = node.empty() ? std::string{} : " on node '" + node + "'";
  losses_.push_back(seen_by + ": its rank" + where + " was lost");
  auto log = runtime::logger("actors.tinker");
  if (used_ >= o.max_restarts)
    tinker::fail_server(seen_by + ": a rank" + where + " was lost and the restart budget (" +
                        std::to_string(o.max_restarts) + ", --max-restarts) is spent; losses: " +
                        joined(losses_));
  ++used_;
  log->warn("rank_lost seen_by={} node={} restart={}/{}", seen_by, node, used_, o.max_restarts);
  tinker_recovery r;
  r.seen_by = seen_by;
  r.lost_node = node;
  r.at_unix = now_unix();
  if (!o.placement_manager) {
    // The embedded default: the same local bundle, under a new generation.
    groups_.replace_placement(current);
    r.new_node = node;
  } else {
    placement_client pgs{groups_.system(), o.placement_manager};
    // The head may not have declared a hung node dead yet: never go back to it.
    auto placed = pgs.place_again(
        o.placement_request, o.recovery_timeout, [&](const placement_group_info& pg) {
          return !node.empty() && !pg.bundles.empty() && pg.bundles.front().node_id == node
                     ? "only the lost node '" + node + "' had room"
                     : std::string{};
        });
    if (!placed)
      tinker::fail_server(seen_by + ": a rank" + where + " was lost and no node had room for "
                          "the service's placement group '" + o.placement_request.name +
                          "' within " + std::to_string(o.recovery_timeout.count()) +
                          " ms (--recovery-timeout); last: " + error_message(placed.error()) +
                          "; losses: " + joined(losses_));
    r.new_node = placed->bundles.empty() ? std::string{} : placed->bundles.front().node_id;
    groups_.replace_placement(std::move(*placed));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log->warn("placement_replaced seen_by={} lost_node={} new_node={} seconds={:.3f}", seen_by,
            node, r.new_node, r.seconds);
  std::lock_guard<std::mutex> done_guard(done_mutex_);
  done_.push_back(std::move(r));
}

std::vector<tinker_recovery> tinker_healing::recoveries() const {
  std::lock_guard<std::mutex> guard(done_mutex_);
  return done_;
}

} // namespace rlforge::actors
