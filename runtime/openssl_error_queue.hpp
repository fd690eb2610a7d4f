#pragma once

namespace rlforge::runtime {

/// Makes CAF 0.17's openssl module safe against failed TLS handshakes.
///
/// OpenSSL requires the calling thread's error queue to be empty before `SSL_read`,
/// `SSL_write`, `SSL_accept` or `SSL_connect` ("SSL_get_error" reports SSL_ERROR_SSL for any
/// leftover entry). CAF 0.17.6 runs every TLS connection of a process on its multiplexer thread
/// and only drains the queue when its (compiled-out) logging is on, so one peer that fails the
/// handshake (no certificate, another CA) leaves errors behind, and the next read of a healthy
/// connection is taken for a failure: the peer refused at the door would disconnect every
/// trusted node. This translation unit defines those four functions in the program, so CAF's
/// calls reach them first: each clears the queue and calls OpenSSL's own (found with
/// `dlsym(RTLD_NEXT, ...)`). A handshake that `SSL_accept` refuses (a peer with no
/// certificate, one of another CA, plain TCP) is logged as a warning of logger "runtime.tls":
/// `tls_refused peer=IP:PORT reason=<OpenSSL's reason>` (peer=unknown when the peer hung up
/// before the refusal), so an operator sees who knocks.
///
/// Calling this function does nothing at run time; referencing it links the definitions into
/// the program (`system_config` does when a TLS directory is given). Thread-safe.
void keep_openssl_error_queue_clean() noexcept;

} // namespace rlforge::runtime
