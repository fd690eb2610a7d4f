#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "actors/tinker_backend.hpp"
#include "service/request_scheduler.hpp"

namespace rlforge::service {

class future_store;

namespace http {
struct server_state;
} // namespace http

/// Settings of `http_server`.
struct server_options {
  /// Address to bind. Loopback by default: exposing the service is an explicit choice.
  std::string host = "127.0.0.1";
  /// TCP port; 0 = an ephemeral port (see `http_server::port()`).
  int port = 0;
  /// Every endpoint except `GET /api/v1/healthz` (and archive downloads, which carry their own
  /// short-lived token) requires header `X-API-Key` equal to this (compared in constant time).
  /// Empty is refused unless `insecure_no_auth`.
  std::string api_key;
  /// Serve without any authentication (development only; `rlforge serve --insecure-no-auth`).
  bool insecure_no_auth = false;
  /// Largest request body accepted (also after zstd decompression); larger → 413.
  size_t max_body_bytes = size_t{64} << 20;
  /// How long `retrieve_future` holds a pending future before answering `try_again`; below the
  /// SDK's 45 s read timeout.
  std::chrono::milliseconds long_poll_hold{25000};
  /// Threads serving HTTP connections (each keep-alive connection and long-poll holds one).
  size_t http_threads = 128;
  /// Directory under which checkpoints are written: `<dir>/<model_id>/<kind>/<name>/`.
  std::string checkpoint_dir;
  /// How long a checkpoint-archive download URL stays valid.
  std::chrono::seconds archive_url_ttl{900};
  /// Most samples one `asample` request may ask for (`num_samples`); more is refused (400).
  int64_t max_num_samples = 4096;
  /// Tokens each streamed sample (OpenAI `stream: true`) generates per turn in its sampling lane:
  /// a chunk is sent to the client as soon as it is generated, and a client that disconnects
  /// stops its generation within a chunk or two (>= 1).
  int64_t stream_chunk_tokens = 8;
  /// Worker pool, seq_id gap timeout, batch size, sample queue bound (429 beyond it) and the
  /// sample slice of fair scheduling.
  request_scheduler::options scheduler;
};

/// The Tinker-compatible HTTP API (TINKER-WIRE.md) over a `tinker_backend` and a
/// `future_store`, on cpp-httplib.
///
/// Heavy operations (create_model, forward_backward, forward, optim_step, save_weights,
/// save_weights_for_sampler, load_weights, unload_model, asample) are decoded on the HTTP thread
/// (syntax only: a bad body → 400, an unknown model / session / checkpoint → 404, nothing runs),
/// then recorded as a pending future in the store and answered `{"request_id"}` at once; the
/// `request_scheduler` runs them on its workers (per-model seq_id order, barriers, batching, fair
/// sampling) and the backend checks them against the model once, so a request it refuses fails
/// its future (category user). The result lands in the store. A refused ordered request still
/// consumes its seq_id (even when its body does not decode), so the model never stalls.
/// Sampling sessions from `save_weights_for_sampler` without a name are bound to a snapshot of
/// the weights at that moment (`tinker_backend::save_sampler_snapshot`). Retries are idempotent:
/// the same `X-Idempotency-Key`, or the same (model_id, seq_id), with the same body returns the
/// original request_id; with another body → 409. `asample` beyond the scheduler's sample bound →
/// 429.
///
/// `retrieve_future` long-polls up to `long_poll_hold`, then answers `{"type":"try_again"}`;
/// results of forward_backward / forward / asample are protobuf when `Accept` names
/// application/x-protobuf and JSON otherwise; failures are `{"error","category"}` (HTTP 200).
/// Every error response is JSON `{"error": message}`.
///
/// Thread safety: `start`, `stop` and the destructor from one thread; the backend is called from
/// scheduler workers (never concurrently for one model) and, for `has_model` and the constant
/// getters, from HTTP threads.
class http_server {
public:
  /// Checks `opts` (throws `std::invalid_argument` naming the bad option: an empty api_key
  /// without insecure_no_auth, an empty checkpoint_dir, a zero hold / thread count / body limit,
  /// max_num_samples < 1, a port outside 0..65535) and builds the scheduler. `backend` and `store`
  /// must outlive the server.
  http_server(server_options opts, actors::tinker_backend& backend, future_store& store);

  /// Stops serving (as `stop`).
  ~http_server();

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// Binds and starts serving on a background thread; returns the bound port. Throws
  /// `std::runtime_error` naming host and port when binding fails. At most once.
  int start();

  /// The bound port (0 before `start`).
  int port() const;

  /// Blocks until `stop` is called (from another thread or a signal handler's helper thread).
  void wait();

  /// Stops accepting connections, wakes every long-poll, fails queued work ("server shutting
  /// down"), waits for running backend calls and joins the threads. Idempotent.
  void stop();

private:
  std::unique_ptr<http::server_state> state_;
};

/// Constant-time comparison of a presented credential with the expected one (the running time
/// does not depend on where they differ).
bool constant_time_equal(const std::string& presented, const std::string& expected);

} // namespace rlforge::service
