#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/rank_op.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// Spawns one rank of kind `kind` as a detached actor (its own OS thread: ranks block in
/// libtorch and collectives). The rank sets its torch intra-op threads to `info.threads` on its
/// own thread, binds that thread to its bundle's CUDA device where this process has it (else the
/// rank computes on the CPU: a virtual GPU; `rank_info::virtual_gpu` says which), creates the
/// kind's state, then answers
/// `(call_atom, std::string op, caf::message args) → op_result`: the typed interface
/// `rlforge::rank_actor` (runtime/cluster_protocol.hpp), returned here as a `caf::actor`.
///
/// Each op of the kind (`actor_kind::ops`, declared with `typed_op`) and each built-in op
/// (`builtin_ops`) checks its arguments against its declared signature before it runs.
///
/// Built-in ops of every kind:
///  - `info` → rank_info; `ping` → (); `kind` → std::string, the rank's kind;
///    `threads` → int32 intra-op threads of the rank's thread
///  - `location` → (std::string host identity, int64 pid, std::string advertised address,
///    std::string device "cpu" or "cuda:N"), see `process_location` (weight_sync.hpp)
///  - `device_memory` → (int64 allocated, int64 reserved, int64 peak allocated, int64 free,
///    int64 total): the rank's CUDA device as this process's caching allocator and the driver
///    see it (backends/devices.hpp); refused (unsupported) on a virtual GPU
///  - `init_collective` (collective_spec) → (): joins the group's collective group (rendezvous
///    through an in-process store or the group's store actor, then a barrier, bounded by the
///    spec's timeout)
///  - `checkpoint_visible` (root, step, role) → (): see checkpoint_probe.hpp
///  - `all_reduce` (tensor_list) → tensor_list: element-wise SUM over ranks
///  - `broadcast` (tensor_list, int32 root) → tensor_list: the root's tensors on every rank
///
/// A failing op (unknown name, bad arguments, a backend exception) answers an error naming
/// group, rank and op; the rank stays alive and keeps its state.
///
/// A kind with background work (`actor_kind::step`, e.g. an engine's decode steps) gets one
/// step after every op and after every step that asks for more, through a `step_atom` message
/// the rank sends itself, so the calls that arrived in the meantime are handled in between.
caf::expected<caf::actor> spawn_rank(caf::actor_system& sys, const std::string& kind,
                                     rank_info info);

/// The built-in ops, with their argument and answer types as above (op_ref, rank_op.hpp).
namespace rank_ops {
inline constexpr op_ref<rank_info()> info{"info"};
inline constexpr op_ref<no_values()> ping{"ping"};
inline constexpr op_ref<std::string()> kind{"kind"};
inline constexpr op_ref<int32_t()> threads{"threads"};
inline constexpr op_ref<std::tuple<std::string, int64_t, std::string, std::string>()> location{
    "location"};
inline constexpr op_ref<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>()> device_memory{
    "device_memory"};
inline constexpr op_ref<no_values(collective_spec)> init_collective{"init_collective"};
inline constexpr op_ref<no_values(std::string, int64_t, std::string)> checkpoint_visible{
    "checkpoint_visible"};
inline constexpr op_ref<tensor_list(tensor_list)> all_reduce{"all_reduce"};
inline constexpr op_ref<tensor_list(tensor_list, int32_t)> broadcast{"broadcast"};
} // namespace rank_ops

} // namespace rlforge::actors
