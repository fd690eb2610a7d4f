#include "runtime/openssl_error_queue.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <string>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "runtime/logging.hpp"

namespace rlforge::runtime {

void keep_openssl_error_queue_clean() noexcept {
}

namespace {

template <class Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

/// "IP:PORT" of the peer on `fd`, or "unknown" (e.g. the peer hung up already).
std::string peer_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "unknown";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    port = ntohs(in->sin6_port);
  } else {
    return "unknown";
  }
  return std::string{host} + ":" + std::to_string(port);
}

/// Logs a handshake this process refused (what `SSL_accept` returned `result` for, the peer
/// `peer`), leaving OpenSSL's error queue and errno as they were: CAF reads both next.
void log_refused_handshake(SSL* ssl, int result, const std::string& peer) noexcept {
  const int saved = errno;
  const int kind = SSL_get_error(ssl, result);
  if (kind != SSL_ERROR_WANT_READ && kind != SSL_ERROR_WANT_WRITE) {
    char reason[256] = "the peer closed the connection";
    if (auto e = ERR_peek_error(); e != 0)
      ERR_error_string_n(e, reason, sizeof(reason));
    try {
      logger("runtime.tls")->warn("tls_refused peer={} reason={}", peer, reason);
    } catch (...) {
      // Logging must not break the handshake's error path.
    }
  }
  errno = saved;
}

} // namespace

} // namespace rlforge::runtime

// The interposed OpenSSL entry points (see the header). C linkage, the signatures of
// <openssl/ssl.h>.
extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  using fn = int (*)(SSL*, void*, int);
  static const fn real = rlforge::runtime::next<fn>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  using fn = int (*)(SSL*, const void*, int);
  static const fn real = rlforge::runtime::next<fn>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  using fn = int (*)(SSL*);
  static const fn real = rlforge::runtime::next<fn>("SSL_accept");
  ERR_clear_error();
  // Asked before the handshake step: a refused peer may be gone by the time it fails.
  const auto peer = rlforge::runtime::peer_of(SSL_get_fd(ssl));
  ERR_clear_error();
  const int r = real(ssl);
  if (r <= 0)
    rlforge::runtime::log_refused_handshake(ssl, r, peer);
  return r;
}

int SSL_connect(SSL* ssl) {
  using fn = int (*)(SSL*);
  static const fn real = rlforge::runtime::next<fn>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

} // extern "C"
