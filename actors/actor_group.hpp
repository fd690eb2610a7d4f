#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "actors/rank_op.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// How to spawn an actor group into a placed placement group.
struct group_spec {
  std::string name;                ///< unique; names the group in every error
  std::string kind;                ///< a registered actor kind (actor_kind.hpp)
  placement_group_info placement;  ///< from the placement-group manager
  int32_t num_ranks = 0;           ///< 0 = one rank per bundle; else a multiple of the bundles
  double gpu_per_rank = 0;         ///< GPU share per rank (0 = bundle GPU / ranks per bundle)
  int32_t threads_per_rank = 0;    ///< torch threads per rank (0 = bundle CPUs / ranks, ≥ 1)
  bool collectives = true;         ///< create the group's c10d process group at spawn
  /// When set, each rank's GPU share is reserved in its bundle through this placement-group
  /// manager (exact across groups sharing a bundle: policy, ref and engines at 0.2 each) and
  /// released when the group stops. Without it only this group's own shares are checked.
  caf::actor placement_manager;
  std::chrono::milliseconds init_timeout{30000};
};

/// The rank → bundle/device layout a spec produces (pure; validated). Rank i goes to bundle
/// i / ranks_per_bundle; each rank gets the bundle's node and devices, its GPU share and its
/// thread count. Errors name the bad value (zero ranks, a rank count that is not a multiple of
/// the bundles, GPU shares that do not fit the bundle, ...).
caf::expected<std::vector<rank_info>> plan_ranks(const group_spec& spec);

/// Spawns the ranks (detached actors) and the group's routing actor (event-based; it never
/// blocks), then, if `spec.collectives`, creates the collective group behind a barrier bounded
/// by `spec.init_timeout`. Blocking: call from a driver thread, not from inside an actor.
/// On any failure everything spawned is stopped again.
///
/// In the embedded default the ranks are spawned in this process. When this actor system is
/// attached to a cluster (cluster.hpp), the agent of the node each bundle is on spawns its
/// ranks; the routing actor stays here and calls them as it calls local ones. Ranks that share a
/// process rendezvous through an in-process store; otherwise rank 0 serves a TCP store on its
/// node's advertised address and Gloo connects the ranks across processes and hosts. Errors
/// then also name the node (`... rank 1 op 'x' on node 'n2': ...`); a rank whose node dies fails
/// the calls it is in with the reason (the connection to its node was lost).
caf::expected<caf::actor> spawn_actor_group(caf::actor_system& sys, const group_spec& spec);

/// Blocking driver-side handle to a group. Calls have a deadline (no infinite waits); when a
/// rank dies, fails or does not answer in time, the error names the group, the rank and the op.
class actor_group {
public:
  actor_group() = default;
  actor_group(caf::actor_system& sys, caf::actor group);

  /// Spawns a group (see `spawn_actor_group`).
  static caf::expected<actor_group> spawn(caf::actor_system& sys, const group_spec& spec);

  /// Pass-through dispatch: the op `op` (its id) with `args` on every rank; results in rank
  /// order.
  caf::expected<std::vector<caf::message>> call_all(caf::atom_value op, const caf::message& args,
                                                    std::chrono::milliseconds timeout);

  /// Mesh dispatch: rank i gets `chunks[i]` (one chunk per rank); results in rank order.
  caf::expected<std::vector<caf::message>> call_mesh(caf::atom_value op,
                                                     std::vector<caf::message> chunks,
                                                     std::chrono::milliseconds timeout);

  /// `call_all` of a declared op (op_ref, rank_op.hpp): `args` checked against its argument
  /// types when this compiles, each rank's answer read as its answer type.
  template <class R, class... Declared, class... Given>
  caf::expected<std::vector<R>> call_all(const op_ref<R(Declared...)>& op,
                                         std::chrono::milliseconds timeout, Given&&... args) {
    return op.answers(call_all(op.id, op.args(std::forward<Given>(args)...), timeout));
  }

  /// `call_mesh` of a declared op: rank i gets `chunks[i]` (each built with `op.args`).
  template <class R, class... Declared>
  caf::expected<std::vector<R>> call_mesh(const op_ref<R(Declared...)>& op,
                                          std::vector<caf::message> chunks,
                                          std::chrono::milliseconds timeout) {
    return op.answers(call_mesh(op.id, std::move(chunks), timeout));
  }

  /// What each rank knows about itself.
  caf::expected<std::vector<rank_info>> ranks();

  /// The rank actors themselves (for tests and direct calls).
  caf::expected<std::vector<caf::actor>> rank_handles();

  /// Stops every rank and the routing actor. Idempotent.
  void stop();

  const caf::actor& handle() const { return group_; }

private:
  caf::actor_system* sys_ = nullptr;
  caf::actor group_;
};

} // namespace rlforge::actors
