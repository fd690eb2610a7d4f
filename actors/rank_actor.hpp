#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/result.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/actor_kind.hpp"
#include "actors/rank_op.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// Spawns one rank of kind `kind` as a detached actor (its own OS thread: ranks block in
/// libtorch and collectives). The rank sets its torch intra-op threads to `info.threads` on its
/// own thread, binds that thread to its bundle's CUDA device where this process has it (else the
/// rank computes on the CPU: a virtual GPU; `rank_info::virtual_gpu` says which), creates the
/// kind's state, then answers the kind's typed interface (`rank_interface`, rank_interface.hpp):
/// a call is `op.call(args...)`, the message `(op id, args...)`, and answers `op_result`
/// holding the op's declared answer. The handle is returned as a `caf::actor`: groups and the
/// dispatcher hold ranks of every kind alike.
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
/// A failing op (bad arguments, a backend exception) answers an error naming group, rank and
/// op; the rank stays alive and keeps its state. A message outside the kind's interface (an
/// unknown op id, or argument types the op does not take) is refused by CAF with
/// `sec::unexpected_message`, and the rank stays alive too.
///
/// A kind with background work (`actor_kind::step`, e.g. an engine's decode steps) gets one
/// step after every op and after every step that asks for more, through a `step_atom` message
/// the rank sends itself, so the calls that arrived in the meantime are handled in between.
caf::expected<caf::actor> spawn_rank(caf::actor_system& sys, const std::string& kind,
                                     rank_info info);

/// The built-in ops, with their ids and their argument and answer types as above (op_ref,
/// rank_op.hpp).
namespace rank_ops {
inline constexpr op_ref<rank_info()> info{"info", caf::atom("info")};
inline constexpr op_ref<no_values()> ping{"ping", caf::atom("ping")};
inline constexpr op_ref<std::string()> kind{"kind", caf::atom("kind")};
inline constexpr op_ref<int32_t()> threads{"threads", caf::atom("threads")};
inline constexpr op_ref<std::tuple<std::string, int64_t, std::string, std::string>()> location{
    "location", caf::atom("location")};
inline constexpr op_ref<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>()> device_memory{
    "device_memory", caf::atom("device_mem")};
inline constexpr op_ref<no_values(collective_spec)> init_collective{"init_collective",
                                                                    caf::atom("init_coll")};
inline constexpr op_ref<no_values(std::string, int64_t, std::string)> checkpoint_visible{
    "checkpoint_visible", caf::atom("ckpt_vis")};
inline constexpr op_ref<tensor_list(tensor_list)> all_reduce{"all_reduce", caf::atom("all_reduce")};
inline constexpr op_ref<tensor_list(tensor_list, int32_t)> broadcast{"broadcast",
                                                                     caf::atom("broadcast")};
} // namespace rank_ops

/// What every rank runs, whatever its kind's interface: the typed behavior `rank_interface`
/// generates hands each call and each step message to these. Called on the rank's own thread.
namespace rank_detail {

/// A rank's state: its kind, its context, and the calls it answers later.
struct rank_state {
  actor_kind kind;
  rank_context ctx;
  /// Calls answered later (`rank_context::defer_reply`): ticket → (promise, error context).
  std::map<uint64_t, std::pair<caf::typed_response_promise<op_result>, std::string>> deferred;
  /// A step message is in the mailbox (at most one at a time).
  bool step_queued = false;
  static const char* name;
};

/// Sets the rank up on its own thread: threads, device, the kind's state, the context's send
/// and step hooks.
void start(caf::scheduled_actor* self, rank_state& st, actor_kind kind, rank_info info);

/// Runs the op `id` on the arguments of the message being handled (its elements after the id);
/// answers its result, an error naming group, rank and op, or a promise for a deferred answer.
caf::result<op_result> call(caf::scheduled_actor* self, rank_state& st, caf::atom_value id);

/// One step of the kind's background work (`timer`: a step the kind asked for after a delay).
void step(caf::scheduled_actor* self, rank_state& st, bool timer);

} // namespace rank_detail

} // namespace rlforge::actors
