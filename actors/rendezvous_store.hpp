#pragma once

#include <chrono>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "backends/collective_group.hpp"
#include "runtime/rendezvous_protocol.hpp"

namespace rlforge::actors {

/// Spawns a rendezvous store (runtime/rendezvous_protocol.hpp) in `sys`. Ranks in other
/// processes reach it through CAF (over the cluster's connections: TLS with the cluster CA when
/// the cluster has one), so no rendezvous port opens. The store lives until `owner` stops (or,
/// without an owner, until it is told to exit); waits still pending then fail at their callers
/// with the request's error. It is an event-based actor: one message at a time, no locks.
rendezvous_store_actor spawn_rendezvous_store(caf::actor_system& sys, const caf::actor& owner);

/// The store `store` seen as a c10d store for `backends::collective_group::create`: each
/// operation is one request from the calling thread (through a scoped actor of the system the
/// handle belongs to), bounded by `timeout` (a wait by its own timeout plus `timeout`). Errors
/// throw `backends::error`: `timeout` when a wait ran out or the store did not answer,
/// `backend_error` when it is gone. Safe to use from several threads at once. Throws
/// `backends::error{invalid_argument}` for a null handle or a timeout <= 0.
backends::store_handle connect_rendezvous_store(const rendezvous_store_actor& store,
                                                std::chrono::milliseconds timeout);

} // namespace rlforge::actors
