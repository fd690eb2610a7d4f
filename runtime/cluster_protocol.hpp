#pragma once

// The messages that cross process boundaries in a cluster (DESIGN.md "Cluster") and the typed
// actor interfaces of the three kinds of actors other processes talk to: the head, a node agent
// and a rank. CAF checks a typed interface when a connection is made (`remote_actor<T>` refuses
// a published actor whose interface differs, naming both), and the join handshake compares the
// rest (version, wire format of every message type, registered actor kinds), so a node or driver
// built from another version is refused before it takes part.
//
// Every struct here has a CAF 0.17 `inspect` overload and is registered in type_registry.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/atom.hpp>
#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "runtime/messages.hpp"

namespace rlforge {

// -- atoms (at most 10 characters, CAF 0.17) ---------------------------------------------------

/// (step_atom [, bool timer]): a rank runs one unit of its kind's background work (sent to
/// itself only; see actors/actor_kind.hpp).
using step_atom = caf::atom_constant<caf::atom("step")>;
/// Placement-group operations (see actors/placement_manager.hpp for their semantics).
using pg_create_atom = caf::atom_constant<caf::atom("pgcreate")>;
using pg_remove_atom = caf::atom_constant<caf::atom("pgremove")>;
using pg_get_atom = caf::atom_constant<caf::atom("pgget")>;
using pg_table_atom = caf::atom_constant<caf::atom("pgtable")>;
using reserve_atom = caf::atom_constant<caf::atom("reserve")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
/// A node joins the head; a node leaves it.
using join_atom = caf::atom_constant<caf::atom("join")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;
/// A node's periodic sign of life (and census of its ranks).
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
/// A driver attaches to the head.
using attach_atom = caf::atom_constant<caf::atom("attach")>;
/// Where a node's agent listens.
using lookup_atom = caf::atom_constant<caf::atom("lookup")>;
/// The cluster's state as JSON (`rlforge status`).
using cluster_status_atom = caf::atom_constant<caf::atom("cstatus")>;
/// The head's metrics as Prometheus text (actors/head_metrics.hpp).
using cluster_metrics_atom = caf::atom_constant<caf::atom("cmetrics")>;
/// A node agent spawns ranks for a driver.
using spawn_ranks_atom = caf::atom_constant<caf::atom("rspawn")>;
/// A driver announces / retires an actor group (for `rlforge status`).
using group_up_atom = caf::atom_constant<caf::atom("groupup")>;
using group_down_atom = caf::atom_constant<caf::atom("groupdown")>;
/// Periodic self-message of the head and the node agents (deadline checks, heartbeats).
using cluster_tick_atom = caf::atom_constant<caf::atom("ctick")>;
/// The node runner hands a (re)connected head to its agent, which then joins it.
using use_head_atom = caf::atom_constant<caf::atom("usehead")>;
/// A node agent's census of its ranks.
using census_atom = caf::atom_constant<caf::atom("census")>;

// -- wire types --------------------------------------------------------------------------------

/// What a node sends when it joins: its resources, where its agent listens, and what it was
/// built with (compared with the head's, see `check_join`).
struct node_join_request {
  node_resources resources;
  std::string address;      ///< the node's advertised address (peers connect to it)
  uint16_t port = 0;        ///< the port its agent is published on
  std::string version;      ///< rlforge version of the node's build
  std::vector<std::string> wire_types; ///< `wire_signature()` of the node's build
  std::vector<std::string> kinds;      ///< actor kinds the node can spawn and their ops, sorted
  std::string host;         ///< host name (for status output)
  int64_t pid = 0;          ///< process id (for status output)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_join_request& x) {
  return f(caf::meta::type_name("node_join_request"), x.resources, x.address, x.port, x.version,
           x.wire_types, x.kinds, x.host, x.pid);
}

inline bool operator==(const node_join_request& a, const node_join_request& b) {
  return a.resources == b.resources && a.address == b.address && a.port == b.port &&
         a.version == b.version && a.wire_types == b.wire_types && a.kinds == b.kinds &&
         a.host == b.host && a.pid == b.pid;
}

/// The head's answer to an accepted join or attach.
struct join_reply {
  std::string cluster_id;   ///< random id of this head's lifetime (changes when it restarts)
  std::string version;      ///< the head's rlforge version
  int64_t heartbeat_ms = 0; ///< how often the node must send a heartbeat
  int64_t dead_after_ms = 0; ///< silence after which the head declares a node dead
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, join_reply& x) {
  return f(caf::meta::type_name("join_reply"), x.cluster_id, x.version, x.heartbeat_ms,
           x.dead_after_ms);
}

inline bool operator==(const join_reply& a, const join_reply& b) {
  return a.cluster_id == b.cluster_id && a.version == b.version &&
         a.heartbeat_ms == b.heartbeat_ms && a.dead_after_ms == b.dead_after_ms;
}

/// What a driver sends when it attaches to the head.
struct driver_hello {
  std::string driver_id;    ///< unique per driver process ("<host>:<pid>:<nonce>")
  std::string version;
  std::vector<std::string> wire_types;
  std::string host;
  int64_t pid = 0;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, driver_hello& x) {
  return f(caf::meta::type_name("driver_hello"), x.driver_id, x.version, x.wire_types, x.host,
           x.pid);
}

inline bool operator==(const driver_hello& a, const driver_hello& b) {
  return a.driver_id == b.driver_id && a.version == b.version && a.wire_types == b.wire_types &&
         a.host == b.host && a.pid == b.pid;
}

/// Where a node's agent listens (the head's answer to a lookup).
struct node_endpoint {
  std::string node_id;
  std::string address;
  uint16_t port = 0;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, node_endpoint& x) {
  return f(caf::meta::type_name("node_endpoint"), x.node_id, x.address, x.port);
}

inline bool operator==(const node_endpoint& a, const node_endpoint& b) {
  return a.node_id == b.node_id && a.address == b.address && a.port == b.port;
}

/// A node's periodic sign of life: its id and how many ranks it runs for which driver.
struct node_heartbeat {
  std::string node_id;
  std::vector<std::string> owners; ///< driver ids with live ranks on the node
  std::vector<int32_t> ranks;      ///< ranks per owner (same order)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_heartbeat& x) {
  return f(caf::meta::type_name("node_heartbeat"), x.node_id, x.owners, x.ranks);
}

inline bool operator==(const node_heartbeat& a, const node_heartbeat& b) {
  return a.node_id == b.node_id && a.owners == b.owners && a.ranks == b.ranks;
}

/// An actor group a driver spawned, as the head lists it.
struct group_record {
  std::string name;
  std::string kind;
  std::string placement_group;
  std::vector<std::string> rank_nodes; ///< node id of rank i
  double spawn_seconds = 0; ///< from the driver's spawn call to every rank up and initialised
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, group_record& x) {
  return f(caf::meta::type_name("group_record"), x.name, x.kind, x.placement_group, x.rank_nodes,
           x.spawn_seconds);
}

inline bool operator==(const group_record& a, const group_record& b) {
  return a.name == b.name && a.kind == b.kind && a.placement_group == b.placement_group &&
         a.rank_nodes == b.rank_nodes && a.spawn_seconds == b.spawn_seconds;
}

// -- typed interfaces --------------------------------------------------------------------------

/// A node agent (actors/node_agent.hpp).
///  - (spawn_ranks_atom, kind, ranks, owner, owner_id) → the rank actors, in the order of
///    `ranks`; the ranks live until `owner` (a driver's session actor, named `owner_id` in the
///    census) is gone, the head is lost, or they are told to exit.
///  - (census_atom) → node_heartbeat: the ranks alive on the node, per owner.
///  - (use_head_atom, head, port) → join_reply: join `head` (a `head_actor` as `caf::actor`: the
///    two interfaces cannot name each other), announcing that the agent is published on `port`
///    (0: not published; only for a node inside the head's process); sent by the node's own
///    runner, refused from other processes.
///  - (leave_atom, reason): the head declared this node dead (it missed heartbeats): the agent
///    stops its ranks and joins again.
///  - (cluster_tick_atom): internal heartbeat timer.
using node_agent_actor =
    caf::typed_actor<caf::replies_to<spawn_ranks_atom, std::string, std::vector<rank_info>,
                                     caf::actor, std::string>::with<std::vector<caf::actor>>,
                     caf::replies_to<census_atom>::with<node_heartbeat>,
                     caf::replies_to<use_head_atom, caf::actor, uint16_t>::with<join_reply>,
                     caf::reacts_to<leave_atom, std::string>, caf::reacts_to<cluster_tick_atom>>;

/// The head (actors/head.hpp): node registry, driver sessions, placement groups, status.
using head_actor = caf::typed_actor<
  caf::replies_to<join_atom, node_join_request, node_agent_actor>::with<join_reply>,
  caf::reacts_to<leave_atom, std::string>,
  caf::reacts_to<heartbeat_atom, node_heartbeat>,
  caf::replies_to<attach_atom, driver_hello, caf::actor>::with<join_reply>,
  caf::replies_to<lookup_atom, std::string>::with<node_endpoint, node_agent_actor>,
  caf::replies_to<pg_create_atom, placement_group_request>::with<placement_group_info>,
  caf::reacts_to<pg_remove_atom, std::string>,
  caf::replies_to<pg_get_atom, std::string>::with<placement_group_info>,
  caf::replies_to<pg_table_atom>::with<std::string>,
  caf::replies_to<reserve_atom, std::string, uint32_t, resource_amounts>::with<uint64_t>,
  caf::reacts_to<release_atom, std::string, uint64_t>,
  caf::reacts_to<group_up_atom, std::string, group_record>,
  caf::reacts_to<group_down_atom, std::string, std::string>,
  caf::replies_to<cluster_status_atom>::with<std::string>,
  caf::replies_to<cluster_metrics_atom>::with<std::string>,
  caf::reacts_to<cluster_tick_atom>>;

// -- versions ----------------------------------------------------------------------------------

/// The rlforge version this process was built from (the CMake project version).
const char* rlforge_version() noexcept;

/// The wire format of this build: one line per registered message type, "name: <default
/// value>" (the default value's rendering shows the fields and their types), plus one line per
/// typed interface above (its signatures, as CAF names them in `sys`). Two builds can talk when
/// these agree; the first line that differs names what changed.
std::vector<std::string> wire_signature(const caf::actor_system& sys);

/// Compares a peer's version and wire signature with this build's (`own_wire`, from
/// `wire_signature`). Empty when they agree; otherwise one sentence naming the first difference
/// from `peer`'s point of view, e.g. "node 'n1' runs rlforge 0.2.0, this head 0.1.0" or
/// "node 'n1' differs in message type rlforge::node_resources: node has 'node_resources(...)',
/// head has 'node_resources(...)'". `peer` names the peer ("node 'n1'"), `self` this side
/// ("head").
std::string describe_mismatch(const std::string& peer, const std::string& self,
                              const std::string& peer_version,
                              const std::vector<std::string>& peer_wire,
                              const std::vector<std::string>& own_wire);

} // namespace rlforge
