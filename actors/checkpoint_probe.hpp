#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "actors/rank_op.hpp"

namespace rlforge::actors {

struct rank_context;

/// The built-in op `checkpoint_visible` of every rank (rank_actor.hpp): (std::string root,
/// int64 global_step, std::string role) → (). Answers () when this rank can see its own
/// complete checkpoint directory `root/global_step_N/<role>/rank_<r>/` (its `meta.json`, written
/// last, exists) on the file system of the node it runs on; otherwise fails naming the path, the
/// node and the two supported setups (a shared file system, or per-node directories that each
/// hold the ranks placed there). A resume asks every rank first, so a checkpoint some rank
/// cannot see is refused before any rank loads anything. Throws `backends::error` for bad
/// arguments.
caf::expected<no_values> checkpoint_visible_op(rank_context& ctx, const std::string& root,
                                                  const int64_t& global_step,
                                                  const std::string& role);

} // namespace rlforge::actors
