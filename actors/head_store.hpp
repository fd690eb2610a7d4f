#pragma once
// What a cluster head keeps across its own restarts (`rlforge head --state FILE`): its registry
// (cluster id, nodes, drivers, actor-group records, placement-group owners) and the log of the
// operations that changed its placement table, in one SQLite file. A restarted head reads the
// registry back and replays the log into a fresh placement manager: the table is a pure
// function of its operations (placement/table.hpp), so the same operations give the same
// placements and the same reservation ids.
//
// Ownership: the head actor owns its store and is its only user (not thread-safe). Every write
// is committed and synced before it returns (a rollback journal, no write-ahead log: the state
// is the one file); a head killed at any moment restarts from its last completed change.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cluster_protocol.hpp"

namespace rlforge::actors {

/// A node as the registry keeps it.
struct stored_node {
  node_join_request request;
  bool alive = true;
  std::string death; ///< why it died ("" while alive)
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, stored_node& x) {
  return f(caf::meta::type_name("stored_node"), x.request, x.alive, x.death);
}

/// An actor group a driver announced, and why it failed ("" while alive).
struct stored_group {
  std::string driver;
  group_record record;
  std::string failed;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, stored_group& x) {
  return f(caf::meta::type_name("stored_group"), x.driver, x.record, x.failed);
}

/// The head's registry.
struct head_registry {
  std::string cluster_id;
  std::string version;                 ///< rlforge_version() of the head that wrote it
  std::vector<std::string> wire;       ///< its wire signature
  std::vector<stored_node> nodes;
  std::vector<driver_hello> drivers;
  std::vector<stored_group> groups;
  std::map<std::string, std::string> pg_owner; ///< placement group → driver id
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, head_registry& x) {
  return f(caf::meta::type_name("head_registry"), x.cluster_id, x.version, x.wire, x.nodes,
           x.drivers, x.groups, x.pg_owner);
}

/// One operation on the placement table, as the head sent it to its manager: `kind` is
/// "add_node" (node_resources), "remove_node" (node id, reason), "create"
/// (placement_group_request, placed at once or after a wait), "remove" (group name),
/// "reserve" (group, bundle, resource_amounts, the reservation id it got) or "release" (group,
/// reservation id); `args` holds them in CAF's binary format.
struct placement_op {
  std::string kind;
  std::vector<char> args;
};

class head_store {
public:
  /// Opens (creating) the SQLite file at `path`. Throws std::runtime_error naming the path and
  /// SQLite's reason (also in a build without SQLite).
  explicit head_store(const std::string& path);
  ~head_store();
  head_store(const head_store&) = delete;
  head_store& operator=(const head_store&) = delete;

  /// The registry last saved, or nullopt for a new file. Throws std::runtime_error when it
  /// cannot be read back (naming the file).
  std::optional<head_registry> registry();

  /// The placement operations logged, in order. Throws as `registry`.
  std::vector<placement_op> placement_log();

  /// Replaces the saved registry. Throws std::runtime_error on a write failure.
  void save(const head_registry& registry);

  /// Appends `op` to the placement log. Throws as `save`.
  void append(const placement_op& op);

  const std::string& path() const { return path_; }

private:
  struct impl;
  std::string path_;
  std::unique_ptr<impl> impl_;
};

} // namespace rlforge::actors
