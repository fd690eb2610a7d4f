#pragma once
// The TCP sockets a process listens on, read from /proc (its file descriptors and its network
// namespace's socket tables): what the cluster tests check to show that no process of a cluster
// listens on a wildcard address.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rlforge::cluster_test {

/// One listening socket.
struct listening_socket {
  std::string address; ///< "127.0.0.1", "0.0.0.0", "::", "::1", ...
  uint16_t port = 0;
  bool wildcard = false; ///< bound to every address (0.0.0.0 or ::)
};

/// The TCP sockets process `pid` holds in the LISTEN state (IPv4 and IPv6). Empty when the
/// process is gone. Thread-safe (reads /proc only).
std::vector<listening_socket> listening_sockets(pid_t pid);

/// "127.0.0.1:41234, [::]:80" for failure messages.
std::string describe(const std::vector<listening_socket>& sockets);

} // namespace rlforge::cluster_test
