#pragma once

#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>

namespace rlforge::runtime {

/// A host and a port, as written "HOST:PORT" ("[::1]:6380" for IPv6 literals).
struct endpoint {
  std::string host;
  uint16_t port = 0;
};

/// Parses "HOST:PORT". Errors name the text and what is wrong (no port, a port outside
/// 1..65535, an empty host).
caf::expected<endpoint> parse_endpoint(const std::string& text);

/// "HOST:PORT" (brackets around IPv6 literals).
std::string to_string(const endpoint& x);

/// True for loopback addresses: 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& address);

/// Turns a CAF connection error into one sentence naming `what` (e.g. "the head at
/// 10.0.0.1:6380") and the likely cause: nothing listening, a refused TLS handshake (a
/// certificate the peer does not trust), an interface mismatch (another rlforge build).
caf::error connection_error(const caf::actor_system& sys, const caf::error& err,
                            const std::string& what);

/// Publishes `handle` on `bind:port` (port 0: the OS picks) over TLS when this system loaded
/// CAF's openssl module (system_config with a TLS directory), plain TCP otherwise. Returns the
/// port.
template <class Handle>
caf::expected<uint16_t> publish_actor(caf::actor_system& sys, const Handle& handle,
                                      uint16_t port, const std::string& bind) {
  if (sys.has_openssl_manager())
    return caf::openssl::publish(handle, port, bind.c_str(), true);
  return sys.middleman().publish(handle, port, bind.c_str(), true);
}

/// Connects to the actor published at `at` (TLS when the openssl module is loaded) and checks
/// its interface is `Handle`'s (CAF refuses another one, naming both). Blocking. Errors go
/// through `connection_error` with `what`. A connection that CAF drops with
/// `connection_timeout` before its handshake finished is tried again, twice at most: CAF 0.17's
/// heartbeat tick can find a connection still in its handshake (nothing heard from it yet) and
/// drop it as silent, which fails the connect at once (seen in `ClusterFailures` about 1 run in
/// 6).
template <class Handle>
caf::expected<Handle> connect_actor(caf::actor_system& sys, const endpoint& at,
                                    const std::string& what) {
  for (int attempt = 0;; ++attempt) {
    caf::expected<Handle> out = sys.has_openssl_manager()
                                  ? caf::openssl::remote_actor<Handle>(sys, at.host, at.port)
                                  : sys.middleman().remote_actor<Handle>(at.host, at.port);
    if (out)
      return out;
    if (out.error() != caf::sec::connection_timeout || attempt == 2)
      return connection_error(sys, out.error(), what);
  }
}

} // namespace rlforge::runtime
