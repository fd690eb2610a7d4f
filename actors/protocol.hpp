#pragma once

// Atoms of the actor-group and placement protocols (≤ 10 characters each, CAF 0.17).

#include <caf/atom.hpp>

namespace rlforge::actors {

/// (call_atom, std::string op, caf::message args) → caf::message: run `op` on one rank.
using call_atom = caf::atom_constant<caf::atom("call")>;
/// (broadcast_call_atom, op, args, timeout_ms) → std::vector<caf::message>: every rank, rank order.
using all_atom = caf::atom_constant<caf::atom("all")>;
/// (mesh_atom, op, std::vector<caf::message> chunks, timeout_ms) → std::vector<caf::message>.
using mesh_atom = caf::atom_constant<caf::atom("mesh")>;
/// (ranks_atom) → std::vector<rank_info> of a group.
using ranks_atom = caf::atom_constant<caf::atom("ranks")>;
/// (handles_atom) → std::vector<caf::actor>: the rank actors of a group.
using handles_atom = caf::atom_constant<caf::atom("handles")>;
/// (step_atom): a rank runs one unit of its kind's background work (sent to itself).
using step_atom = caf::atom_constant<caf::atom("step")>;
/// (stop_atom): a group stops its ranks and itself.
using stop_atom = caf::atom_constant<caf::atom("stop")>;

/// Placement-group manager: create, remove, look up, describe, add a node.
using pg_create_atom = caf::atom_constant<caf::atom("pgcreate")>;
using pg_remove_atom = caf::atom_constant<caf::atom("pgremove")>;
using pg_get_atom = caf::atom_constant<caf::atom("pgget")>;
using pg_table_atom = caf::atom_constant<caf::atom("pgtable")>;
using add_node_atom = caf::atom_constant<caf::atom("addnode")>;
using pg_expire_atom = caf::atom_constant<caf::atom("pgexpire")>;
using reserve_atom = caf::atom_constant<caf::atom("reserve")>;
using release_atom = caf::atom_constant<caf::atom("release")>;

} // namespace rlforge::actors
