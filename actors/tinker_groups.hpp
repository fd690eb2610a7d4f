#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher_backend_options.hpp"
#include "actors/trainer_client.hpp"
#include "tinker/error.hpp"

/// What the pieces of the Tinker backend (dispatcher_backend.hpp) share: spawning and stopping
/// their one-rank actor groups and dispatchers, and turning runtime errors into Tinker request
/// errors.
namespace rlforge::actors {

/// The Tinker category of a runtime error, from the rlforge error code the worker, engine or
/// dispatcher set: invalid_argument, out_of_range and decode_error are the user's, not_found is
/// `not_found`, everything else (timeouts, dead ranks, other categories) the server's.
tinker::error_category category_of(const caf::error& err);

/// The readable text of `err`: its rlforge message, or CAF's rendering for other categories.
std::string error_text(const caf::error& err);

/// Throws `tinker::request_error` of `category_of(err)` with `context` and `error_text(err)`.
[[noreturn]] void throw_request_error(const caf::error& err, const std::string& context);

/// The value of `x`, or `throw_request_error`.
template <class T> T value_of(caf::expected<T> x, const std::string& context) {
  if (!x)
    throw_request_error(x.error(), context);
  return std::move(*x);
}

/// Nothing, or `throw_request_error`.
void check(caf::expected<void> x, const std::string& context);

/// Spawns and stops the Tinker backend's actor groups: every group is one rank on bundle 0 of the
/// current placement (the options' at first; `replace_placement` after a lost node).
/// Thread-safe; `sys` and the options must outlive it.
class tinker_groups {
public:
  tinker_groups(caf::actor_system& sys, const dispatcher_backend_options& opts);

  /// Where groups spawned from now on go, and the placement's generation (0 at first, +1 at
  /// each `replace_placement`): a group spawned under an older generation may be on a lost node.
  std::pair<placement_group_info, uint64_t> placement() const;

  /// The current placement generation alone (what every call compares; no copy of the
  /// placement).
  uint64_t generation() const;

  /// Makes `pg` the placement of every group spawned from now on and starts a new generation.
  void replace_placement(placement_group_info pg);

  /// A fresh group of one rank of `kind`, and the placement generation it was spawned under;
  /// `what` names the request in errors. Throws `request_error` (server) when it cannot be
  /// spawned (out of placement shares, a lost node, runtime).
  std::pair<actor_group, uint64_t> spawn(const std::string& kind, const std::string& what);

  /// A fresh dispatcher (dispatcher.hpp).
  caf::actor spawn_dispatcher();

  /// Stops `g` and waits (up to the timeout) until its ranks and routing actor have terminated,
  /// so their models are freed and their placement shares given back when this returns. Throws
  /// `request_error` (server) when they do not terminate in time.
  void stop_and_wait(actor_group& g);

  /// Stops `dispatcher` (no wait).
  void stop(const caf::actor& dispatcher);

  /// A blocking client of `dispatcher` with the options' timeout.
  trainer_client client(const caf::actor& dispatcher) const;

  caf::actor_system& system() const { return *sys_; }
  const dispatcher_backend_options& options() const { return *opts_; }

private:
  caf::actor_system* sys_;
  const dispatcher_backend_options* opts_;
  std::atomic<uint64_t> counter_{0};
  mutable std::mutex mutex_;      ///< guards the two below
  placement_group_info placement_;
  uint64_t generation_ = 0;
};

} // namespace rlforge::actors
