#include "runtime/openssl_error_queue.hpp"

#include <dlfcn.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace rlforge::runtime {

void keep_openssl_error_queue_clean() noexcept {
}

namespace {

template <class Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
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
  return real(ssl);
}

int SSL_connect(SSL* ssl) {
  using fn = int (*)(SSL*);
  static const fn real = rlforge::runtime::next<fn>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

} // extern "C"
