#pragma once

#include <string>

#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "actors/actor_kind.hpp"

namespace rlforge::actors {

/// The built-in collective ops of every rank (see rank_actor.hpp): `init_collective`
/// (collective_spec), `all_reduce` (tensor_list), `broadcast` (tensor_list, int32 root).
/// Throws `backends::error` for bad arguments and collective failures.
caf::expected<caf::message> run_collective_op(rank_context& ctx, const std::string& op,
                                              const caf::message& args);

/// Drops the in-process rendezvous store of a group (after its ranks are gone).
void release_local_store(const std::string& name);

} // namespace rlforge::actors
