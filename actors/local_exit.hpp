#pragma once

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>

namespace rlforge::actors {

/// Stops `handle` (a head or a node agent, which ignore exit messages that do not come from an
/// actor of their own process: anonymous exits and exits from peers are dropped) with an exit
/// message sent from a local actor. Thread-safe; call from outside actors.
template <class Handle>
void stop_from_this_process(caf::actor_system& sys, const Handle& handle) {
  caf::scoped_actor self{sys};
  self->send_exit(caf::actor_cast<caf::actor>(handle), caf::exit_reason::user_shutdown);
}

/// True when an exit message with `source` comes from another actor of the process `self`
/// lives in. An anonymous exit (`caf::anon_send_exit`) carries the target itself as its source
/// wherever it was sent from, so it does not count: it may come from a peer.
inline bool local_exit(const caf::actor_addr& source, const caf::actor_addr& self) {
  return source && source.node() == self.node() && source != self;
}

} // namespace rlforge::actors
