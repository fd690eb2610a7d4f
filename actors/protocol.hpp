#pragma once

// Atoms of the actor-group and placement protocols (≤ 10 characters each, CAF 0.17).

#include <caf/atom.hpp>

#include "runtime/cluster_protocol.hpp"

namespace rlforge::actors {

/// A call to one rank is `op.call(args...)`: the op's id, then its arguments (op_ref,
/// rank_op.hpp; rank_interface.hpp). The atoms that also cross process boundaries are defined
/// with the typed interfaces, in runtime/cluster_protocol.hpp.
///
/// (all_atom, op id, args, timeout_ms) → std::vector<caf::message>: every rank, rank order.
using all_atom = caf::atom_constant<caf::atom("all")>;
/// (mesh_atom, op id, std::vector<caf::message> chunks, timeout_ms) → std::vector<caf::message>.
using mesh_atom = caf::atom_constant<caf::atom("mesh")>;
/// (ranks_atom) → std::vector<rank_info> of a group.
using ranks_atom = caf::atom_constant<caf::atom("ranks")>;
/// (handles_atom) → std::vector<caf::actor>: the rank actors of a group.
using handles_atom = caf::atom_constant<caf::atom("handles")>;
using rlforge::step_atom;
/// (stop_atom): a group stops its ranks and itself.
using stop_atom = caf::atom_constant<caf::atom("stop")>;

/// Placement-group manager: create, remove, look up, describe, add or remove a node, status.
using rlforge::pg_create_atom;
using rlforge::pg_get_atom;
using rlforge::pg_remove_atom;
using rlforge::pg_table_atom;
using rlforge::release_atom;
using rlforge::reserve_atom;
using add_node_atom = caf::atom_constant<caf::atom("addnode")>;
using remove_node_atom = caf::atom_constant<caf::atom("rmnode")>;
using pg_expire_atom = caf::atom_constant<caf::atom("pgexpire")>;
using pg_status_atom = caf::atom_constant<caf::atom("pgstatus")>;

} // namespace rlforge::actors
