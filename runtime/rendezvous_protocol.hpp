#pragma once

// The rendezvous store's messages: the key-value store through which the ranks of a Gloo group
// (an actor group's collectives, a trainer-engine weight channel) find each other when they live
// in several processes. An actor serves it (actors/rendezvous_store.hpp) and the ranks reach it
// over the connections the cluster already has (TLS with the cluster CA when the cluster has
// one), so no rendezvous port opens anywhere.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace rlforge {

// Atoms (at most 10 characters, CAF 0.17).
using kv_set_atom = caf::atom_constant<caf::atom("kvset")>;
using kv_get_atom = caf::atom_constant<caf::atom("kvget")>;
using kv_add_atom = caf::atom_constant<caf::atom("kvadd")>;
using kv_swap_atom = caf::atom_constant<caf::atom("kvswap")>;
using kv_check_atom = caf::atom_constant<caf::atom("kvcheck")>;
using kv_wait_atom = caf::atom_constant<caf::atom("kvwait")>;
using kv_erase_atom = caf::atom_constant<caf::atom("kverase")>;
using kv_count_atom = caf::atom_constant<caf::atom("kvcount")>;
using kv_expire_atom = caf::atom_constant<caf::atom("kvexpire")>;

/// The store (c10d `Store` semantics; values are bytes):
///  - (kv_set, key, value) → (): sets `key`.
///  - (kv_get, key, timeout_ms) → value: waits up to `timeout_ms` for `key`, then answers its
///    value or fails with `errc::timeout` naming the key.
///  - (kv_add, key, delta) → the new value: adds to the decimal integer stored at `key` (0 when
///    absent) and stores the sum as decimal text.
///  - (kv_swap, key, expected, desired) → the value now stored: sets `desired` when the current
///    value is `expected` (or `key` is absent and `expected` is empty).
///  - (kv_check, keys) → whether every key is set, at once.
///  - (kv_wait, keys, timeout_ms) → true: waits until every key is set, or fails with
///    `errc::timeout` naming the missing ones.
///  - (kv_erase, key) → whether it was set.
///  - (kv_count) → the number of keys.
///  - (kv_expire, waiter): internal timer of a wait (sent by the store to itself).
/// Waits are answered in the order their keys arrive; a store stops when its owner stops.
using rendezvous_store_actor = caf::typed_actor<
  caf::reacts_to<kv_set_atom, std::string, std::vector<uint8_t>>,
  caf::replies_to<kv_get_atom, std::string, int64_t>::with<std::vector<uint8_t>>,
  caf::replies_to<kv_add_atom, std::string, int64_t>::with<int64_t>,
  caf::replies_to<kv_swap_atom, std::string, std::vector<uint8_t>,
                  std::vector<uint8_t>>::with<std::vector<uint8_t>>,
  caf::replies_to<kv_check_atom, std::vector<std::string>>::with<bool>,
  caf::replies_to<kv_wait_atom, std::vector<std::string>, int64_t>::with<bool>,
  caf::replies_to<kv_erase_atom, std::string>::with<bool>,
  caf::replies_to<kv_count_atom>::with<int64_t>,
  caf::reacts_to<kv_expire_atom, uint64_t>>;

} // namespace rlforge
