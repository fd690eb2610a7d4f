#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "actors/actor_kind.hpp"

namespace rlforge::actors {

/// The built-in collective ops of every rank (see rank_actor.hpp), registered by
/// `builtin_ops`. Each throws `backends::error` for bad arguments and collective failures.
///
/// `init_collective`: joins the group's collective group (rendezvous through an in-process store
/// or the group's store actor, bounded by the spec's timeout).
caf::expected<no_values> init_collective_op(rank_context& ctx, const collective_spec& spec);

/// `all_reduce`: element-wise SUM of `tensors` over the group's ranks.
caf::expected<tensor_list> all_reduce_op(rank_context& ctx, const tensor_list& tensors);

/// `broadcast`: rank `root`'s `tensors` on every rank.
caf::expected<tensor_list> broadcast_op(rank_context& ctx, const tensor_list& tensors,
                                         const int32_t& root);

/// Drops the in-process rendezvous store of a group (after its ranks are gone).
void release_local_store(const std::string& name);

} // namespace rlforge::actors
