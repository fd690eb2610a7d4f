#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/prometheus_text.hpp"

/// The cluster head's Prometheus metrics (`rlforge head --metrics-port`, GET /metrics).
///
/// The head keeps counters and histograms in its own `metrics_registry` as events happen
/// (`count_heartbeat`, `count_node_death`, `observe_spawn`); `head_metrics_text` reads the gauges
/// from a cluster status document (the JSON of `cluster_status_atom`, head.hpp) into the same
/// registry and renders it:
///  - `rlforge_cluster_nodes{state="alive"|"dead"}`, `rlforge_cluster_drivers`;
///  - `rlforge_node_heartbeat_age_seconds{node}`: time since each live node's last heartbeat
///    (the heartbeat lag; dead nodes have no series);
///  - `rlforge_node_ranks{node}`: ranks each live node hosts;
///  - `rlforge_placement_groups{state}`: placement groups per state (created, pending, failed);
///  - `rlforge_actor_groups{state="alive"|"failed"}`;
///  - `rlforge_node_heartbeats_total`, `rlforge_node_deaths_total`;
///  - `rlforge_actor_group_spawn_seconds`: histogram of the time drivers took to spawn and
///    initialise each actor group on the cluster's nodes.
///
/// Thread safety: as `metrics_registry` (the head calls these from its own actor).
namespace rlforge::actors {

void count_heartbeat(runtime::metrics_registry& r);
void count_node_death(runtime::metrics_registry& r);
void observe_spawn(runtime::metrics_registry& r, double seconds);

/// Sets the gauges from `status` and renders every metric of `r`.
std::string head_metrics_text(const nlohmann::json& status, runtime::metrics_registry& r);

} // namespace rlforge::actors
