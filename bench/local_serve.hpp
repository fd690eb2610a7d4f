#pragma once
// `rlforge serve` inside a benchmark's process: the real Tinker backend (actors/dispatcher_backend)
// on a random tiny Llama written into a directory, its HTTP server on a loopback port, and a
// client of it. Shared by the service benchmarks (serve_backend_bench, serve_chunked_bench).
#include <filesystem>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "actors/dispatcher_backend.hpp"
#include "runtime/system_config.hpp"
#include "service/future_store.hpp"
#include "service/http_server.hpp"
#include "service/tinker_client.hpp"

namespace rlforge::bench {

/// Owns everything it starts; the destructor stops the server before the backend and the actor
/// system go (members are destroyed in reverse order). Not copyable or movable; one thread drives
/// `client` at a time unless the caller makes more clients on `port`.
class local_serve {
public:
  /// Writes the base model into `dir`/tiny-base (seed 7), starts the backend, the future store
  /// (`dir`/serve.db) and the server (checkpoints in `dir`/checkpoints) with API key `api_key`.
  /// Throws std::runtime_error when the actor system's configuration fails.
  local_serve(const std::filesystem::path& dir, const std::string& api_key);
  ~local_serve();
  local_serve(const local_serve&) = delete;
  local_serve& operator=(const local_serve&) = delete;

  int port() const { return port_; }

private:
  /// The configuration the actor system is built from (parsed, and the kinds registered, first).
  static runtime::system_config& configured(runtime::system_config& cfg);
  /// Writes the base model into `dir` and returns the backend's options naming it.
  static actors::dispatcher_backend_options backend_options(const std::filesystem::path& dir);
  /// The server's options: `api_key`, checkpoints in `dir`/checkpoints.
  static service::server_options server_options(const std::filesystem::path& dir,
                                                const std::string& api_key);

  runtime::system_config cfg_;
  caf::actor_system sys_;

public:
  actors::dispatcher_backend backend;

private:
  std::unique_ptr<service::future_store> store_;
  std::unique_ptr<service::http_server> server_;
  int port_ = 0;

public:
  service::tinker_client client;
};

} // namespace rlforge::bench
