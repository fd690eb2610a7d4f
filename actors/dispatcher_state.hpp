#pragma once

// The dispatcher's state and the helpers its source files share. Internal: the public
// interface is actors/dispatcher.hpp. The dispatcher is one actor, in four files:
//  - dispatcher.cpp: the training roles' calls, routing of every op, status, role
//    registration and the behavior;
//  - dispatcher_plumbing.cpp: steps, the colocated-call queue, calls to groups and ranks
//    (watched for death), errors with context, residency (offload/onload, sleep/wake);
//  - dispatcher_engines.cpp: placement of sample requests (generate, submit, cancel: the
//    routes op_route::spread_requests, stream_requests, cancel_streams) on engine ranks,
//    streamed results, engine deaths;
//  - dispatcher_sync.cpp: weight sync orchestration (versions, pauses, residency, transports,
//    Gloo channels).
//
// Ownership: `dispatcher_state` belongs to the dispatcher actor. Thread-safety: everything here
// runs on that actor (its handlers and the continuations of its requests), one at a time;
// nothing is shared with other threads. Ordering: calls to colocated roles run one at a time,
// in arrival order (`serialize`).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/dispatcher.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_op.hpp"
#include "actors/weight_sync.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors::dispatch {

struct role_entry {
  caf::actor group;
  int32_t world_size = 1;
  bool engine = false;
  /// The ops of the group's kind, read from the kind's registration when the role registers:
  /// each one's signature (checked before a call moves anything) and how it is run
  /// (`rank_op::dispatch`, declared with the op). Ops not listed run on every rank with nothing
  /// onloaded first.
  std::map<caf::atom_value, rank_op> ops;
  std::vector<caf::actor> ranks;
  std::vector<rank_info> infos;
  std::vector<process_location> where;
  /// What the dispatcher believes is on the device. Workers: model, optimizer state. Engines:
  /// weights, KV cache (awake).
  bool model = true;
  bool optimizer = true;
  /// Engines: estimated tokens of the generate calls in flight, per rank.
  std::vector<int64_t> load;
  /// Engines: why each rank died (empty while it is alive). Dead ranks get no more requests
  /// and are left out of weight syncs; the others carry on.
  std::vector<std::string> dead;

  bool alive(size_t rank) const { return rank >= dead.size() || dead[rank].empty(); }
};

/// A call that must not interleave with other colocated calls; runs `done` when finished.
using serial_job = std::function<void(std::function<void()> done)>;

/// A request submitted through `submit`, running on an engine rank until its result arrives.
struct stream_entry {
  caf::actor consumer;
  int64_t user_id = 0;
  std::string role;
  size_t rank = 0;
  int64_t cost = 0; ///< its share of the rank's load estimate
};

/// A Gloo weight channel the dispatcher keeps open from one sync source to its engines.
struct gloo_channel_record {
  std::string members; ///< the sender role, its ranks' and the receivers' addresses, in rank order
  std::string name;    ///< the channel name both ends key it by
  int64_t syncs = 0;   ///< syncs completed on it
};

struct dispatcher_state {
  std::map<std::string, role_entry> roles;
  /// Requests submitted through `submit`, by the dispatcher's own id for them.
  std::map<int64_t, stream_entry> streams;
  int64_t next_stream = 1;
  std::set<std::string> colocated;
  std::string transport = "auto";
  /// Gloo syncs go as deltas (dispatcher_delta_atom).
  bool delta = false;
  /// The transport each engine rank got in the last sync ("<role>/<rank>" → transport).
  std::map<std::string, std::string> last_sync;
  /// Every sync that completed: how many, the bytes the senders sent, their wall time.
  sync_totals syncs;
  /// The Gloo weight channel of each sync source (weight_sync.hpp), while it is open.
  std::map<std::string, gloo_channel_record> gloo_channels;
  /// Gloo channels opened so far (each a rendezvous); a sync on an open one reuses it.
  int64_t gloo_channels_opened = 0;
  /// Where Gloo channels rendezvous: a store actor of this process, spawned at the first one.
  rendezvous_store_actor rendezvous;
  int64_t weight_version = 0;
  bool busy = false;
  std::deque<serial_job> waiting;
  /// Calls waiting for a rank's answer (rank_call), by the rank's address: run when the rank
  /// is declared dead (a rank killed mid-call, or on a hung node, never answers).
  /// Each gets why the rank died.
  std::map<caf::actor_addr, std::map<int64_t, std::function<void(const std::string&)>>>
      rank_watchers;
  int64_t next_watcher = 1;
  static const char* name;
};

using self_ptr = caf::stateful_actor<dispatcher_state>*;

using reply_fn = std::function<void(caf::expected<op_result>)>;
using done_fn = std::function<void(caf::error)>;
using step = std::function<void(done_fn)>;
using results_fn = std::function<void(caf::expected<std::vector<caf::message>>)>;

// -- dispatcher_plumbing.cpp ------------------------------------------------------------------

/// "dispatcher role '<role>' op '<op>'": how every error of a call begins (the op by its name,
/// `op_name`; or a step that is no op of a kind, such as "register").
std::string prefix(const std::string& role, caf::atom_value op);
std::string prefix(const std::string& role, const std::string& op);

/// Re-labels an error with the dispatcher's context (the group's own message names the rank).
caf::error wrap(self_ptr self, const std::string& role, caf::atom_value op, const caf::error& err);
caf::error wrap(self_ptr self, const std::string& role, const std::string& op,
                const caf::error& err);

/// The registered roles, comma-separated ("none" when there are none).
std::string role_list(const dispatcher_state& st);

/// How `e`'s kind declared `op` to be run (the defaults for an op it does not declare).
op_dispatch dispatch_of(const role_entry& e, caf::atom_value op);

/// The id of the op of `e`'s kind declared with `route` (e.g. the engine's cancel_streams
/// op); an internal error naming the role when its kind declares none.
caf::expected<caf::atom_value> op_routed(const role_entry& e, const std::string& role,
                                         op_route route);

/// Runs `steps` one after the other; `done` gets the first error, or none after the last step.
void run_steps(std::shared_ptr<std::vector<step>> steps, size_t i, done_fn done);

/// Runs `job` once every colocated call queued before it has finished.
void serialize(self_ptr self, serial_job job);

/// `op(args)` on every rank of `group`; results in rank order.
void group_all(self_ptr self, const caf::actor& group, caf::atom_value op, caf::message args,
               int64_t timeout_ms, results_fn k);

/// `op(args)` on one rank actor; `k` runs once, with its answer, or with
/// `request_receiver_down` as soon as the rank is declared dead (engine_down), or at the
/// deadline.
void rank_call(self_ptr self, const caf::actor& rank, caf::atom_value op, caf::message args,
               int64_t timeout_ms, std::function<void(caf::expected<caf::message>)> k);

/// The role's entry, or nullptr when it is not registered (any more).
role_entry* find_role(self_ptr self, const std::string& role);

/// The error of a call whose role was unregistered while it ran.
caf::error role_gone(const std::string& role, caf::atom_value op);

/// The error of an engine role whose ranks have all died, naming each rank's cause.
caf::error no_live_engine(const role_entry& e, const std::string& role, caf::atom_value op);

/// The least-loaded spreading of `requests` over the live ranks of engine role `e`; `added` is
/// indexed by rank. Empty when no rank is alive.
std::vector<size_t> spread_over_live(const role_entry& e, const std::vector<sample_request>& requests,
                                     std::vector<int64_t>& added);

/// An error of one rank call, prefixed with `context`; keeps the `errc` code of the rank's own
/// error (invalid input stays invalid input).
caf::error with_context(self_ptr self, const std::string& context, const caf::error& err,
                        int64_t timeout_ms);

/// Which of a role's residency slots a residency step moves.
struct residency_slots {
  bool model = true;     ///< the model (an engine's weights)
  bool optimizer = true; ///< the optimizer state (an engine's KV cache)
};

/// Moves `slots` of `role` on or off the device with the op its kind declares for that
/// (`op_residency::tagged_on` / `tagged_off`: workers' onload/offload, engines'
/// wake_up/sleep, under the tags the op declares) and records it.
step residency_step(self_ptr self, const std::string& role, bool on, residency_slots slots,
                    int64_t timeout_ms);

/// Records in `e` what op `how` left on the device after a call with `args` succeeded.
void record_residency(role_entry& e, const op_dispatch& how, const caf::message& args);

/// The steps that make room for a call to `role` under colocation: offload (or put to sleep)
/// every other colocated role with anything on the device, except those in `keep`, then onload
/// what the call needs and is missing. Nothing when `role` is not colocated.
std::vector<step> prepare_steps(self_ptr self, const std::string& role, bool need_model,
                                bool need_optimizer, int64_t timeout_ms,
                                const std::set<std::string>& keep = {});

// -- dispatcher_engines.cpp -------------------------------------------------------------------

/// Checks the arguments of an op routed `spread_requests` (the engine's `generate`) before
/// anything is sent.
caf::error check_generate_args(const std::string& role, caf::atom_value op,
                               const caf::message& args);

/// An op routed `spread_requests` on engine role `role`: requests spread over its live ranks,
/// rows in request order.
void generate_call(self_ptr self, const std::string& role, caf::atom_value op,
                   const caf::message& args, int64_t timeout_ms, reply_fn k);

/// Checks the arguments of an op routed `stream_requests` (`submit`) before anything is sent.
caf::error check_submit_args(const std::string& role, caf::atom_value op, const caf::message& args);

/// An op routed `stream_requests`: each result sent to its consumer as it finishes.
void submit_call(self_ptr self, const std::string& role, caf::atom_value op,
                 const caf::message& args, int64_t timeout_ms, reply_fn k);

/// An op routed `cancel_streams` (`cancel`): stops submitted requests by their ids.
void cancel_call(self_ptr self, const std::string& role, caf::atom_value op,
                 const caf::message& args, int64_t timeout_ms, reply_fn k);

/// A streamed request's result, passed on to its consumer.
void forward_result(self_ptr self, generation_result& r);

/// An engine rank died: its streamed requests fail to their consumers, the calls waiting on it
/// fail, and it gets no more work.
void engine_down(self_ptr self, const caf::actor_addr& who, const caf::error& reason);

// -- dispatcher_sync.cpp ----------------------------------------------------------------------

/// The registered engine roles.
std::vector<std::string> engine_roles(self_ptr self);

/// Checks the arguments of `dispatcher_ops::sync_weights` from `role` before anything moves.
caf::error check_sync_args(self_ptr self, const std::string& role, const caf::message& args);

/// `save_weights_for_sampler` from `role` to every engine role (see dispatcher.hpp).
void sync_call(self_ptr self, const std::string& role, const std::string& pause_mode,
               int64_t least_version, int64_t timeout_ms, reply_fn k);

} // namespace rlforge::actors::dispatch
