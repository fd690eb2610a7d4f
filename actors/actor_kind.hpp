#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "actors/rank_op.hpp"
#include "backends/error.hpp"
#include "runtime/messages.hpp"

namespace rlforge::backends {
class collective_group;
} // namespace rlforge::backends

namespace rlforge::actors {

/// What one rank owns while it lives: who it is, its collective group (after
/// `init_collective`), and the kind's own state.
struct rank_context {
  rank_info info;
  std::string kind; ///< the name of the rank's kind (answered by the built-in op `kind`)
  std::unique_ptr<backends::collective_group> collective;
  /// The kind's state, created by `actor_kind::make_state`; its ops get it by type
  /// (`typed_op`).
  std::unique_ptr<kind_state> state;
  /// Set by an op to make the rank exit with this reason right after the op, without
  /// answering it (e.g. a fatal, unrecoverable device error): callers see the rank die.
  caf::error exit_reason;

  /// Deferred replies, for ops that cannot answer yet (an engine's `generate` while paused):
  /// the op calls `defer_reply()`, keeps the returned ticket and returns any value (it is
  /// ignored); the rank then holds the call's response promise instead of answering. A later op
  /// answers it with `deliver(ticket, result)`; the rank sends every delivered result right
  /// after that op, before that op's own reply, with the same error context as a direct answer.
  uint64_t defer_reply();
  /// Queues the answer of a deferred call (see `defer_reply`).
  void deliver(uint64_t ticket, caf::expected<caf::message> result);

  /// Sends `msg` to `to` with the rank as the sender (set by the rank actor; e.g. an engine's
  /// streamed results). Only valid on the rank's own thread, inside an op or a step.
  std::function<void(const caf::actor& to, caf::message msg)> send;

  /// Asks for one more call of the kind's `step` after `delay` even if nothing else happens
  /// (e.g. a deadline to enforce while the engine is paused). Set by the rank actor.
  std::function<void(std::chrono::milliseconds delay)> step_after;

  /// Bookkeeping of deferred replies, read and cleared by the rank actor after every op.
  std::optional<uint64_t> deferred_ticket;
  std::vector<std::pair<uint64_t, caf::expected<caf::message>>> deliveries;
  uint64_t next_ticket = 0;

  rank_context();
  ~rank_context();
  rank_context(rank_context&&) noexcept;
  rank_context& operator=(rank_context&&) noexcept;
};

/// Background work of a rank between messages: runs one bounded unit (an engine's decode step)
/// and returns whether more remains. Must not throw (the rank logs and drops an exception).
using step_fn = std::function<bool(rank_context&)>;

/// A kind of rank actor ("policy", "engine", ...): a state factory, ops, each declared with
/// its id and argument types (`op_ref`, `typed_op`, rank_op.hpp), its typed CAF interface
/// (`rank_interface`, rank_interface.hpp) and optional background work. Every kind also answers
/// the built-in ops (`builtin_ops`, rank_actor.hpp).
///
/// `step`, when set, is called after every op and again after every step that returned true,
/// each time through a message the rank sends itself, so calls that arrived in the meantime are
/// handled first: ops interleave with steps, one at a time, on the rank's thread. Results a step
/// delivers (`rank_context::deliver`) are sent right after it.
struct actor_kind {
  std::string name;
  std::function<std::unique_ptr<kind_state>(const rank_info&)> make_state;
  /// The kind's ops by id.
  std::map<caf::atom_value, rank_op> ops;
  step_fn step;
  /// Spawns one rank of this kind as a typed actor of its interface (set by `implements`).
  caf::actor (*spawn)(caf::actor_system&, const actor_kind&, const rank_info&) = nullptr;
  /// The ids of the ops the interface lists (set by `implements`); `register_kind` checks that
  /// `ops` holds exactly these.
  std::vector<caf::atom_value> interface_ids;

  /// Adds `op` under its id (replacing an op of that id).
  void add(rank_op op) {
    auto key = op.id;
    ops.insert_or_assign(key, std::move(op));
  }

  /// Makes the kind's ranks typed actors of `Interface`, a `rank_interface<ops...>`.
  template <class Interface> void implements() {
    spawn = &Interface::spawn;
    interface_ids = Interface::ids();
  }
};

/// The name of the op whose id is `id` among the built-in ops and the registered kinds' ops
/// (ids name ops of one name; `register_kind` checks it), or the atom's text for an unknown id.
/// For errors and logs. Thread-safe.
std::string op_name(caf::atom_value id);

/// Registers a kind under its name so groups (and node agents, for remote spawns) can spawn it.
/// Registering the same name again replaces it. Thread-safe. Refuses (throws
/// `backends::error{internal}`, naming the op) a kind without an interface, whose ops differ
/// from its interface's, that redefines a built-in op, or whose op shares an id with an op of
/// another name (of a registered kind or built in).
void register_kind(actor_kind kind);

/// The kind registered under `name`, or an error naming it and the known kinds.
caf::expected<actor_kind> find_kind(const std::string& name);

/// Names of all registered kinds, sorted.
std::vector<std::string> kind_names();

/// The ops every rank answers whatever its kind (rank_actor.cpp), by id.
const std::map<caf::atom_value, rank_op>& builtin_ops();

/// Every registered kind's interface, one line per op, sorted:
/// "kind.op<id>(signature) -> (results)", or "-> message" for an untyped answer (the
/// built-in ops as kind "rank"). A cluster refuses a node whose lines differ from the head's,
/// naming them.
std::vector<std::string> kind_interfaces();

} // namespace rlforge::actors
