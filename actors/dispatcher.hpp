#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

namespace rlforge::actors {

/// (dispatcher_register_atom, std::string role, caf::actor group) → int32 DP size: adds (or
/// replaces) the actor group serving `role` ("policy", "critic", "ref", ...). Groups may be
/// added at any time, e.g. a critic after the policy has trained.
using dispatcher_register_atom = caf::atom_constant<caf::atom("dregister")>;

/// (dispatcher_call_atom, std::string role, std::string op, caf::message args,
///  int64 timeout_ms) → op_result: runs `op` on the role's group (see `spawn_dispatcher`).
using dispatcher_call_atom = caf::atom_constant<caf::atom("dcall")>;

/// (dispatcher_lcm_atom) → int32: least common multiple of the registered groups' DP sizes
/// (1 when none): a batch of a multiple of it shards evenly over every role.
using dispatcher_lcm_atom = caf::atom_constant<caf::atom("dlcm")>;

/// (dispatcher_roles_atom) → std::vector<std::string>: the registered roles, sorted.
using dispatcher_roles_atom = caf::atom_constant<caf::atom("droles")>;

/// Spawns the dispatcher: an event-based actor (it never blocks) that routes driver requests to
/// the actor groups of the training roles.
///
/// Ops of `dispatcher_call_atom`:
///  - `forward` (batch_payload) and `forward_backward` (batch_payload, loss_request) →
///    op_result{batch_result}: the batch is padded to a multiple of the role's DP size (copies
///    of real rows with loss_mask 0), shard i goes to rank i (mesh call), and the per-row
///    outputs come back concatenated in input order without the rows the dispatcher added (one
///    output row per input row). Metrics combine over ranks by their suffix: `:sum` adds (so
///    `loss:sum` is the loss of the whole batch), `:max` / `:min` take the extreme, and `:mean`
///    is the mean weighted by each rank's loss-mask weight (real tokens), which equals the mean
///    over the whole batch for token-level means. An empty batch is refused.
///  - every other op (`init_model`, `optim_step`, `set_lr`, `set_algorithm_config`,
///    `save_checkpoint`, `load_checkpoint`, `save_hf_model` = the workers' `export_hf`) goes to
///    all ranks with the same arguments; the answer is rank 0's.
///
/// Every call has a deadline (`timeout_ms` > 0 per rank). Errors name the role and op, and the
/// group's error names the rank; an unknown role names the registered ones.
caf::actor spawn_dispatcher(caf::actor_system& sys);

} // namespace rlforge::actors
