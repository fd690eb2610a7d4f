#pragma once
// Network namespaces for the cluster tests: "another host" on this machine (its own network
// stack, joined to this one by a veth pair). Needs root and `ip` (iproute2).

#include <string>

namespace rlforge::cluster_test {

/// A network namespace joined to the test's own by a veth pair: this side `host_ip`, the
/// namespace's side `node_ip` (a /24 of its own per `index`). Removed, with the pair, on
/// destruction. Names and subnets derive from the test's pid and `index` (0..9), so concurrent
/// tests and several namespaces of one test do not collide.
struct network_namespace {
  explicit network_namespace(int index = 0);
  ~network_namespace();
  network_namespace(const network_namespace&) = delete;
  network_namespace& operator=(const network_namespace&) = delete;

  std::string name, host_if, host_ip, node_ip;
  bool created = false; ///< `ip netns add` worked (it needs CAP_SYS_ADMIN, not only uid 0)
  bool ok = false;      ///< and the veth pair is up with both addresses
};

/// What this machine lacks to create network namespaces ("root ...", "the ip command ..."), or
/// empty when nothing is missing (creating one may still fail in a container without
/// CAP_SYS_ADMIN: see `network_namespace::created`).
std::string missing_requirement();

} // namespace rlforge::cluster_test
