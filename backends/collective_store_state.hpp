#pragma once
// Internal to backends/: what the rendezvous stores (collective_store.cpp) and the collective
// groups that use them (collective_group.cpp) share. A `store_handle` owns a `store_state`; the
// c10d store in it is safe to use from several threads at once (c10d's contract), and a group
// wraps it in its own prefixed, time-bounded view.
#include <chrono>
#include <cstdint>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backends/collective_group.hpp"

namespace rlforge::backends {

namespace detail {

struct store_state {
  store_kind kind;
  std::uint16_t port = 0;
  std::string description;
  c10::intrusive_ptr<c10d::Store> store;
};

/// "<n> ms", for error messages.
std::string ms(std::chrono::milliseconds x);

/// Throws error{invalid_argument} naming `what` unless `timeout` > 0.
void check_timeout(const char* what, std::chrono::milliseconds timeout);

/// Throws error{invalid_argument} naming `what` unless `world_size` >= 1.
void check_world_size(const char* what, int world_size);

} // namespace detail

} // namespace rlforge::backends
