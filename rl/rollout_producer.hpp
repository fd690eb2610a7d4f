#pragma once
// The rollout producer of an RL loop (rl_loop.hpp): an actor that keeps the inference engines
// busy with the loop's rollouts and hands the finished ones to the trainer with bounded
// staleness. It talks to the engines only through the dispatcher (actors/dispatcher.hpp
// `submit` / `cancel`) and to the trainer only through messages, so producer, engines and
// trainer may each run on another node.
#include <cstdint>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>

namespace rlforge::rl {

using rl_add_atom = caf::atom_constant<caf::atom("rladd")>;
using rl_take_atom = caf::atom_constant<caf::atom("rltake")>;
using rl_state_atom = caf::atom_constant<caf::atom("rlstate")>;
using rl_restore_atom = caf::atom_constant<caf::atom("rlrestore")>;
using rl_stop_atom = caf::atom_constant<caf::atom("rlstop")>;
using rl_expire_atom = caf::atom_constant<caf::atom("rlexpire")>;

/// What the producer needs to know.
struct producer_options {
  std::string engine_role = "engines"; ///< the dispatcher's engine role it submits to
  int64_t request_timeout_ms = 600000; ///< each submission's deadline on the engines (> 0)
  /// Most submissions of one rollout (>= 1): a rollout lost with a dead engine, handed back by
  /// `pause(abort)` or past its deadline is submitted again until this many tries failed.
  int64_t max_submissions = 4;
};

/// Spawns a producer submitting to `options.engine_role` of `dispatcher`.
///
/// Ops (wire types in runtime/messages.hpp; errors are `rlforge::errc` values with a message):
///  - (rl_add_atom, std::vector<rollout>) → int64 rollouts held (waiting + finished): submits
///    the rollouts (ids unique among those held, no rows yet) at once, all or none: the
///    dispatcher's refusal of a request, a repeated id or a rollout with rows is the answer and
///    nothing is kept.
///  - (rl_take_atom, int64 count, int64 version, int64 max_staleness, int64 timeout_ms) →
///    rollout_batch: `count` finished rollouts for a trainer at weight `version` (see
///    rollout_buffer::take: staler ones are dropped and counted), answered as soon as they are
///    there. Fails at once when fewer than `count` are held at all, when an earlier submission
///    failed for good (no engine left alive, a rollout out of tries: the error names it), or
///    after `timeout_ms` without enough, naming how many are waiting and finished; one take at
///    a time (a second one while another waits is refused).
///  - (rl_state_atom) → rollout_state: a snapshot for a checkpoint (rollouts in flight are listed
///    as waiting, without their partial rows).
///  - (rl_restore_atom, rollout_state) → int64 rollouts resubmitted: loads a snapshot into a
///    producer that holds nothing yet (refused otherwise) and submits its waiting rollouts.
///  - (rl_stop_atom) → int64 requests stopped: cancels what is in flight and forgets every
///    waiting rollout (finished ones stay takeable); the producer stays usable.
///
/// Ordering: results are handled in arrival order; a take is answered with the rollouts that
/// finished first. Thread-safety: it is an actor; any number of senders.
caf::actor spawn_rollout_producer(caf::actor_system& sys, caf::actor dispatcher,
                                  producer_options options = {});

} // namespace rlforge::rl
