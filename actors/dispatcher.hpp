#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "actors/engine.hpp"
#include "actors/rank_op.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// (dispatcher_register_atom, std::string role, caf::actor group) → int32 DP size: adds (or
/// replaces) the actor group serving `role` ("policy", "critic", "ref", ...). Groups may be
/// added at any time, e.g. a critic after the policy has trained.
using dispatcher_register_atom = caf::atom_constant<caf::atom("dregister")>;

/// (dispatcher_unregister_atom, std::string role) → (): removes `role` (a worker or engine
/// group) from the dispatcher; the group itself keeps running (its owner stops it). Calls to the
/// role already under way fail naming the role; later calls are refused as for any unknown
/// role. The colocation declaration is left as it was. An unknown role is an error (not_found)
/// naming the registered ones.
using dispatcher_unregister_atom = caf::atom_constant<caf::atom("dunreg")>;

/// (dispatcher_call_atom, std::string role, caf::atom_value op, caf::message args,
///  int64 timeout_ms) → op_result: runs the op whose id is `op` (op_ref::id) on the role's
///  group (see `spawn_dispatcher`).
using dispatcher_call_atom = caf::atom_constant<caf::atom("dcall")>;

/// Ops of `dispatcher_call_atom` whose arguments or answer are the dispatcher's own (op_ref,
/// rank_op.hpp). Every other op is one its role's kind declares (actor_kind.hpp: worker_ops,
/// engine_ops), called with the kind's types and run as the op's `op_dispatch` says.
namespace dispatcher_ops {
/// The weight sync from a training role to the engines, which the dispatcher runs itself on no
/// rank kind: ([pause mode[, least version]]) → the engines' new version (see
/// `spawn_dispatcher`).
inline constexpr op_ref<int64_t(std::optional<std::string>, std::optional<int64_t>)> sync_weights{
    "save_weights_for_sampler", caf::atom("sync_wts")};
/// An engine role's streaming `submit` (op_route::stream_requests): (consumer, ids, requests)
/// → the engine rank of each request; the call's own timeout_ms is the requests' deadline.
inline constexpr op_ref<std::vector<int32_t>(caf::actor, std::vector<int64_t>,
                                             std::vector<sample_request>)>
    submit{engine_ops::submit.name, engine_ops::submit.id};
} // namespace dispatcher_ops

/// (dispatcher_register_atom, std::string role, caf::actor group, std::string kind) → int32:
/// the same with the group's kind: "worker" (policy, critic, ref) or "engine" (inference
/// engines, engine.hpp).

/// (dispatcher_lcm_atom) → int32: least common multiple of the registered training groups' DP
/// sizes (1 when none): a batch of a multiple of it shards evenly over every role.
using dispatcher_lcm_atom = caf::atom_constant<caf::atom("dlcm")>;

/// (dispatcher_roles_atom) → std::vector<std::string>: the registered roles, sorted.
using dispatcher_roles_atom = caf::atom_constant<caf::atom("droles")>;

/// (dispatcher_colocate_atom, std::vector<std::string> roles) → (): declares that `roles`
/// share their devices (SkyRL's `colocate_all`: policy, ref, critic and engines in one
/// placement group at 0.2 GPU each). Replaces an earlier declaration; roles may be registered
/// before or after. An empty list turns colocation off.
using dispatcher_colocate_atom = caf::atom_constant<caf::atom("dcoloc")>;

/// (dispatcher_transport_atom, std::string transport) → (): the weight transport every sync
/// uses: "auto" (default: the fastest that reaches each engine), "in_process", "shm" or "gloo".
using dispatcher_transport_atom = caf::atom_constant<caf::atom("dtransp")>;

/// (dispatcher_delta_atom, bool on) → (): delta weight syncs (off by default): every sync that
/// goes through a Gloo channel sends only the elements that changed since the engines' version
/// when that is smaller (backends/weights/gloo_transport.hpp), bit-identical to a full sync.
/// Refused while the transport is forced to one that moves whole weights (in_process, shm,
/// cuda_ipc); with "auto" it applies to the engines reached through Gloo.
using dispatcher_delta_atom = caf::atom_constant<caf::atom("ddelta")>;

/// (dispatcher_status_atom, int64 timeout_ms) → std::string: a JSON text with, per role, its
/// kind, DP size, whether it is colocated, and what the dispatcher believes is on the device
/// (`model_on_device`, `optimizer_on_device`; for engines `weights_awake`, `kv_cache_awake`);
/// `weight_version` (the last version synced to the engines); `last_sync`, the transport each
/// engine rank got in the last sync ({"<role>/<rank>": "in_process" | "shm" | "gloo"});
/// `gloo_channels_opened` (Gloo weight channels opened so far, each one rendezvous) and
/// `gloo_channels` ({"<source role>": {"channel", "syncs"}}: the channel open now and the syncs
/// completed on it; a sync reuses the channel while its engines stay the same); and the
/// per-device memory ledger
/// `devices`: for each device ("<node>/gpu<id>", or "<node>/cpu" for a rank without GPU), the
/// resident bytes each role's ranks report there (their `memory` op), measured now.
using dispatcher_status_atom = caf::atom_constant<caf::atom("dstatus")>;

/// What the weight syncs that completed so far cost, in the dispatcher's life.
struct sync_totals {
  int64_t count = 0;  ///< syncs completed
  int64_t bytes = 0;  ///< bytes the sender ranks sent (all engines of a sync)
  double seconds = 0; ///< wall time from the first send to the last receiver's answer, summed
};

/// (dispatcher_syncs_atom) → (int64 count, int64 bytes, double seconds): `sync_totals`. Each
/// completed sync is also logged at info: `event=weight_sync source version engines transport
/// bytes seconds`.
using dispatcher_syncs_atom = caf::atom_constant<caf::atom("dsyncs")>;

/// Spawns the dispatcher: an event-based actor (it never blocks) that routes driver requests to
/// the actor groups of the training roles and to the inference engines.
///
/// How each op below is run is declared with the op in its kind (`op_dispatch`, rank_op.hpp):
/// what is onloaded first, its route over the ranks, and what it leaves on the device. The
/// dispatcher checks a call's arguments against the op's signature (batch ops) or its route's
/// own check (sample requests) before it moves anything.
///
/// Ops of `dispatcher_call_atom` on a training role:
///  - `forward` (batch_payload[, loss_request]) and `forward_backward` (batch_payload,
///  loss_request) →
///    op_result{batch_result}: the batch is padded to a multiple of the role's DP size (copies
///    of real rows with loss_mask 0), shard i goes to rank i (mesh call), and the per-row
///    outputs come back concatenated in input order without the rows the dispatcher added (one
///    output row per input row). Metrics combine over ranks by their suffix: `:sum` adds (so
///    `loss:sum` is the loss of the whole batch), `:max` / `:min` take the extreme, and `:mean`
///    is the mean weighted by each rank's loss-mask weight (real tokens), which equals the mean
///    over the whole batch for token-level means. An empty batch is refused.
///  - `save_weights_for_sampler` ([std::string pause_mode[, int64 least_version]]) →
///    op_result{int64 version}: copies the role's weights (LoRA merged) to every live engine
///    rank and returns the engines' new weight version: one more than the highest they held, or
///    `least_version` when that is higher (a resumed run continues its numbering). Colocated with the engines: offload the other colocated roles,
///    onload the policy's model (its optimizer state goes off the device), wake the engines'
///    weights, transfer, offload the policy, wake the engines' KV cache. Not colocated: pause
///    the engines in `pause_mode` (default `keep`: requests in flight stop between two steps
///    and continue on the new weights after `resume`, their later tokens tagged with the new
///    version; `abort`: they are stopped and handed back, see engine.hpp `pause`; calls that
///    arrive meanwhile wait), transfer, resume (also after a failed transfer). `abort` is refused
///    for a role colocated with the engines, and any other mode is refused by name. Each engine rank
///    gets the transport `choose_transport` picks for it (weight_sync.hpp) unless
///    `dispatcher_transport_atom` set one. A refused transfer leaves the engines' weights and
///    versions as they were.
///  - every other op (`init_model`, `optim_step`, `set_lr`, `set_algorithm_config`,
///    `save_checkpoint`, `load_checkpoint`, `save_hf_model`,
///    `offload`, `onload`, `memory`) goes to all ranks with the same arguments; the answer is
///    rank 0's.
/// Ops on an engine role:
///  - `generate` (std::vector<sample_request>) → op_result{std::vector<sample_output>}: the
///    requests are spread over the engine ranks, each to the rank with the least outstanding
///    work (estimated as num_samples × (prompt + max_tokens) tokens, counting the calls in
///    flight), each rank runs its share in its continuous batch, and the outputs come back in
///    request order (a request with num_samples n gives n consecutive rows). Refused before any work,
///    naming the request: an empty list, an empty prompt, max_tokens <= 0, num_samples < 1 (the
///    engines check the rest: context length, vocabulary, sampling parameters).
///  - `submit` (caf::actor consumer, std::vector<int64_t> ids, std::vector<sample_request>) →
///    op_result{std::vector<int32_t> engine rank of each request}: the streaming form of
///    `generate` for a producer that keeps the engines busy (engine.hpp `submit`). Requests are
///    spread like `generate` (each to the least-loaded rank) and accepted all or none (checked
///    as `generate`; ids are the consumer's, unique among its requests in flight); `timeout_ms`
///    is each request's deadline. Each request's `generation_result` reaches `consumer` (with
///    its id) as soon as it finishes. When an engine rank dies, every request it was running
///    reaches `consumer` as a `generation_result` without rows, `error_code` rank_failed and an
///    error naming the role and rank: requeue those; nothing else is lost.
///    A dead engine rank gets no more requests (`generate` and `submit` spread over the live
///    ranks) and is left out of weight syncs and of `pause` / `resume`; a `generate` or `submit`
///    call that met a rank dying (before or while it ran its share) goes again, whole, to the
///    live ranks (seeded samples repeat their tokens). Once every rank of the role is dead,
///    `generate`, `submit` and `save_weights_for_sampler` fail with rank_failed, naming each
///    rank's cause.
///  - `cancel` (caf::actor consumer, std::vector<int64_t> ids) → op_result{int64 stopped}: stops
///    those submitted requests (their results arrive with unfinished rows "abort").
///  - `sleep` / `wake_up` (tags), `pause` ([mode]), `resume` and every other engine op go to all
///    ranks (answer: rank 0's).
///
/// Colocation: before a call to a colocated role the dispatcher offloads (workers) or puts to
/// sleep (engines) every other colocated role that has anything on the device, then onloads only
/// what the call needs: `forward` the model; `forward_backward`, checkpoints the model and the
/// optimizer; `save_hf_model` the model; `generate` the engines' weights and KV cache.
/// `optim_step` never onloads (it follows `forward_backward`; a worker whose state is off the
/// device refuses it clearly). Calls to colocated roles run one at a time, in arrival order.
///
/// Every call has a deadline (`timeout_ms` > 0 per rank). Errors name the role and op, and the
/// group's error names the rank; an unknown role names the registered ones.
caf::actor spawn_dispatcher(caf::actor_system& sys);

/// The least-loaded spreading of a `generate` call over `added.size()` engines: request i goes
/// to the engine whose load (`in_flight[j]`, the estimated tokens of calls still running, plus
/// `added[j]`, what this call gave it so far) is smallest, ties to the lowest index; its cost
/// num_samples × (prompt + max_tokens) is then added to `added[j]`. Returns each request's
/// engine. Pure; `in_flight` may be shorter than `added` (missing entries count 0).
std::vector<size_t> spread_requests(const std::vector<sample_request>& requests,
                                    std::vector<int64_t>& added,
                                    const std::vector<int64_t>& in_flight);

} // namespace rlforge::actors
