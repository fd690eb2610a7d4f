#pragma once

#include <functional>
#include <memory>
#include <string>

/// A small HTTP server that answers `GET /metrics` with Prometheus text, for processes that have
/// no HTTP service of their own (`rlforge head --metrics-port`). `rlforge serve` serves
/// /metrics from its own server (http_server.hpp).
///
/// Every other path is a 404. No authentication: it binds loopback unless told otherwise, and it
/// reads state only. Thread safety: `render` is called from the server's threads, one scrape at
/// a time; construction, `start` and destruction from one thread.
namespace rlforge::service {

class metrics_server {
public:
  /// `render` produces the exposition text; it may throw (the scrape is then a 503 naming why).
  explicit metrics_server(std::function<std::string()> render);
  ~metrics_server();

  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// Binds `host:port` (0 = an ephemeral port) and serves on a background thread; returns the
  /// bound port. Throws `std::runtime_error` naming the address when it cannot bind.
  int start(const std::string& host, int port);

  /// Stops serving and joins the thread. Idempotent.
  void stop();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace rlforge::service
