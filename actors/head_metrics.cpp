#include "actors/head_metrics.hpp"

#include <map>

namespace rlforge::actors {

void count_heartbeat(runtime::metrics_registry& r) {
  r.add("rlforge_node_heartbeats_total", "Heartbeats the head received from nodes.", {});
}

void count_node_death(runtime::metrics_registry& r) {
  r.add("rlforge_node_deaths_total", "Nodes the head declared dead (or that left).", {});
}

void observe_spawn(runtime::metrics_registry& r, double seconds) {
  r.observe("rlforge_actor_group_spawn_seconds",
            "Time a driver took to spawn and initialise an actor group on the nodes.", {},
            seconds, runtime::latency_buckets_seconds());
}

std::string head_metrics_text(const nlohmann::json& status, runtime::metrics_registry& r) {
  const auto nodes = status.value("nodes", nlohmann::json::array());
  double alive = 0, dead = 0;
  r.clear_gauge("rlforge_node_heartbeat_age_seconds");
  r.clear_gauge("rlforge_node_ranks");
  for (const auto& n : nodes) {
    if (!n.value("alive", false)) {
      ++dead;
      continue;
    }
    ++alive;
    const std::string id = n.value("id", "");
    r.set("rlforge_node_heartbeat_age_seconds",
          "Seconds since each live node's last heartbeat reached the head.", {{"node", id}},
          n.value("last_heartbeat_ms", 0.0) / 1000.0);
    r.set("rlforge_node_ranks", "Ranks each live node hosts.", {{"node", id}},
          n.value("ranks", 0.0));
  }
  r.set("rlforge_cluster_nodes", "Nodes known to the head, by state.", {{"state", "alive"}},
        alive);
  r.set("rlforge_cluster_nodes", "Nodes known to the head, by state.", {{"state", "dead"}}, dead);
  std::map<std::string, double> pgs;
  for (const auto& g : status.value("placement_groups", nlohmann::json::array()))
    ++pgs[g.value("state", "unknown")];
  r.clear_gauge("rlforge_placement_groups");
  for (const auto& [state, n] : pgs)
    r.set("rlforge_placement_groups", "Placement groups, by state.", {{"state", state}}, n);
  double groups_alive = 0, groups_failed = 0;
  for (const auto& g : status.value("actor_groups", nlohmann::json::array()))
    ++(g.value("state", "") == "alive" ? groups_alive : groups_failed);
  r.set("rlforge_actor_groups", "Actor groups drivers announced, by state.", {{"state", "alive"}},
        groups_alive);
  r.set("rlforge_actor_groups", "Actor groups drivers announced, by state.",
        {{"state", "failed"}}, groups_failed);
  r.set("rlforge_cluster_drivers", "Drivers attached to the head.", {},
        static_cast<double>(status.value("drivers", nlohmann::json::array()).size()));
  // Declared up front, so a scrape before the first event shows them at 0.
  r.add("rlforge_node_heartbeats_total", "Heartbeats the head received from nodes.", {}, 0);
  r.add("rlforge_node_deaths_total", "Nodes the head declared dead (or that left).", {}, 0);
  return r.render();
}

} // namespace rlforge::actors
