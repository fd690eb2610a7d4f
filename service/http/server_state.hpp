#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "actors/tinker_backend.hpp"
#include "runtime/logging.hpp"
#include "runtime/prometheus_text.hpp"
#include "service/future_store.hpp"
#include "service/http_server.hpp"
#include "service/request_scheduler.hpp"
#include "service/wire/limits.hpp"
#include "strings/format.hpp"

namespace rlforge::prompt {
class chat_prompt;
}

/// What the endpoint areas of `http_server` (service/http/*_endpoints.cpp) share: the server's
/// state and the helpers every heavy endpoint uses (recording futures, scheduling, seq_id
/// bookkeeping, checkpoint lookup). Internal to service/.
namespace rlforge::service::http {

using json = nlohmann::json;
namespace fs = std::filesystem;

inline constexpr const char* proto_type = "application/x-protobuf";
inline constexpr const char* json_type = "application/json";
inline constexpr const char* api = "/api/v1/";

/// The statuses an endpoint fails with by itself (Tinker's categories and the store's errors
/// map to theirs in `current_http_failure`).
enum class http_status : int {
  bad_request = 400,
  not_found = 404,
  conflict = 409,
  too_many_requests = 429,
  internal_error = 500,
  unavailable = 503,
};

/// An HTTP error with its status, thrown by endpoints; the router answers `{"error": message}`.
struct http_error : std::runtime_error {
  http_error(http_status s, const std::string& message)
      : std::runtime_error(message), status(static_cast<int>(s)) {}
  int status;
};

void reply_json(httplib::Response& res, const json& body, int status = 200);
void reply_error(httplib::Response& res, int status, const std::string& message);

/// "2026-01-02T03:04:05.678Z" (strings/format.hpp).
using strings::iso_time;

/// 32 random hex characters.
std::string random_token();

/// True when the request's Accept header names protobuf.
bool accepts_proto(const httplib::Request& req);

/// A non-negative integer query parameter, `fallback` when absent; 400 naming it otherwise.
int64_t query_int(const httplib::Request& req, const std::string& name, int64_t fallback,
                  int64_t max);

json lora_json(const tinker::lora_config& l);
json metadata_json(const std::map<std::string, std::string>& m);

/// The parsed "tinker://<model_id>/<weights|sampler_weights>/<name>"; 400 for anything else.
struct tinker_path_parts {
  std::string model_id;
  std::string kind;
  std::string name;
};
tinker_path_parts parse_tinker_path(const std::string& path);

/// 400 unless `c` holds sampler weights: sampling needs a tinker://.../sampler_weights/...
/// checkpoint, not training state (the Tinker and the OpenAI endpoints both check it so).
void require_sampler_kind(const checkpoint_record& c);

/// Bytes of the regular files under `dir`.
uint64_t tree_size(const fs::path& dir);

/// A checkpoint as the SDK's `Checkpoint` JSON.
json checkpoint_json(const checkpoint_record& c);

/// A handler and the router's way to add one (`post`, `get`, `put`, `del` take the path after
/// /api/v1/, a regular expression for cpp-httplib; every handler's exceptions become error
/// replies).
using handler = std::function<void(const httplib::Request&, httplib::Response&)>;
struct routes {
  std::function<void(const std::string&, handler)> post, get, put, del;
};

/// The server: options, backend, store, scheduler, HTTP server and long-poll state.
/// Thread-safety: members documented with their mutex; the rest is set before serving starts.
struct server_state {
  server_state(server_options o, actors::tinker_backend& b, future_store& s)
      : opts(std::move(o)), backend(b), store(s) {}

  server_options opts;
  actors::tinker_backend& backend;
  future_store& store;
  std::shared_ptr<spdlog::logger> log = runtime::logger("service");
  httplib::Server svr;
  std::unique_ptr<request_scheduler> sched;
  std::thread listener;
  int bound_port = 0;
  bool started = false;
  wire_limits limits;

  /// Long-poll wake-ups: bumped whenever a future becomes final, and at stop (poll_mutex).
  std::mutex poll_mutex;
  std::condition_variable poll_cv;
  uint64_t generation = 0;
  bool stopping = false;
  std::condition_variable stopped_cv;
  bool stopped = false;

  /// Serializes "record in the store, then queue in the scheduler", so a retry racing its
  /// original sees either nothing or the queued original.
  std::mutex submit_mutex;

  /// Metrics (GET /metrics): counters and histograms written as requests go; gauges read at
  /// each scrape (metrics_endpoint.cpp). Thread-safe on its own.
  runtime::metrics_registry metrics;
  /// Futures recorded and not yet final → (type, when recorded) (in_flight_mutex), for the
  /// latency histogram.
  std::mutex in_flight_mutex;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> in_flight;

  /// The base model's tokenizer and chat template for the OpenAI endpoints, loaded on their first
  /// use (chat_mutex).
  std::mutex chat_mutex;
  std::shared_ptr<const prompt::chat_prompt> chat;
  /// When the server started (Unix seconds; GET /v1/models reports it as the base model's
  /// `created`).
  int64_t started_seconds = 0;

  /// Short-lived archive download tokens → (tinker path, expiry) (archive_mutex).
  std::mutex archive_mutex;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> archives;

  /// Wakes every long-poll: a future became final.
  void notify_final();

  /// Counts future `id` final with `outcome` ("ok" or its failure category) and observes its
  /// latency since it was recorded (once: later calls for the same id count nothing).
  void future_final(const std::string& id, const std::string& outcome);

  /// Stores a result / a failure of future `id` and wakes the long-polls.
  void complete(const std::string& id, const std::string& bytes, const std::string& type);
  void fail(const std::string& id, const failure& f);

  /// A scheduler completion that encodes the result with `encode` into future `id`.
  template <class T>
  request_scheduler::completion<T> finish_with(const std::string& id,
                                               std::function<std::string(const T&)> encode,
                                               std::string content_type) {
    return {[this, id, encode, content_type](T x) {
              std::string bytes;
              try {
                bytes = encode(x);
              } catch (const tinker::request_error& e) {
                fail(id, failure{tinker::error_category::server, e.what()});
                return;
              }
              complete(id, bytes, content_type);
            },
            [this, id](const failure& f) { fail(id, f); }};
  }

  /// A completion storing a JSON text result.
  request_scheduler::completion<std::string> finish_json(const std::string& id);

  /// Records a future; returns {request_id, true} when it is new and must be scheduled (409 for
  /// a retry with another body).
  std::pair<std::string, bool> record(const std::string& type, const std::string& model_id,
                                      int64_t seq_id, const httplib::Request& req,
                                      const std::string& endpoint);

  /// Queues `schedule` for a freshly recorded future; a refusal fails the future and the call.
  void schedule_or_fail(const std::string& id, const std::function<void()>& schedule);

  /// 404 unless the model exists in this process (created here or pending creation).
  void require_model(const std::string& model_id);

  /// The checkpoint at `tinker_path` (404 when unknown; expired ones are purged first).
  checkpoint_record require_checkpoint(const std::string& tinker_path);

  /// `<checkpoint_dir>/<model_id>/<kind>/<name>`.
  std::string checkpoint_path(const std::string& model_id, const std::string& kind,
                              const std::string& name) const;

  /// Now + ttl_seconds in ms, or none.
  std::optional<int64_t> expiry(bool has_ttl, int64_t ttl_seconds) const;

  /// Removes checkpoints whose ttl_seconds ran out (their directories, then their rows). Runs
  /// lazily, before the calls that list, save or hand out checkpoints.
  void purge_expired();

  /// `{"request_id", "model_id"?}`.
  json submitted(const std::string& id, const std::string& model_id = "") const;
};

/// Consumes the seq_id of an ordered request that is refused before it is queued (bad input,
/// an unparsable body, an unknown checkpoint, ...): the SDK has used that seq_id up, and the
/// model's later requests must not wait for it. The ids are read leniently from the raw body
/// (`ordered_request_ids`), so even a body that does not decode (a bare NaN literal, a corrupt
/// protobuf after the ids) gives them up. Disarmed once the request is queued or recognized as a
/// retry.
struct seq_guard {
  server_state& s;
  std::string model_id;
  int64_t seq_id = -1;
  bool armed = false;
  seq_guard(server_state& s, const httplib::Request& req);
  void set(const std::string& m, int64_t q);
  ~seq_guard();
};

/// What a handler's exception answers, decided in one place for the whole server: an
/// `http_error` its status, a `tinker::request_error` its category's, a store error its kind's
/// (404, 409, 400, 500), anything else 500 (logged with the request's path). Call it inside a
/// catch block: it rethrows the exception in flight to look at it.
struct http_failure {
  int status = 500;
  std::string message;
};
http_failure current_http_failure(server_state& s, const httplib::Request& req);

/// After a handler: logs a refusal (status >= 400) and counts the request under `endpoint`.
void finish_request(server_state& s, const httplib::Request& req, const httplib::Response& res,
                    const std::string& endpoint);

/// A route's label in the metrics: its path with each regular-expression group written `{}`
/// ("training_runs/{}/checkpoints").
std::string endpoint_label(const std::string& route);

/// Counts one HTTP request answered with `status` (`rlforge_http_requests_total`).
void count_request(server_state& s, const std::string& endpoint, int status);

/// Adds `tokens` to `rlforge_tokens_total{kind}` ("generated", "trained", "scored").
void count_tokens(server_state& s, const char* kind, double tokens);

/// `GET /metrics` (Prometheus text), added through `get_at_root` (a path from the root).
void add_metrics_endpoint(server_state& s,
                          const std::function<void(const std::string&, handler)>& get_at_root);

/// Adds the endpoints of each area (one source file each).
void add_session_endpoints(server_state& s, routes& r);
void add_training_endpoints(server_state& s, routes& r);
void add_checkpoint_endpoints(server_state& s, routes& r);
void add_sampling_endpoints(server_state& s, routes& r);
void add_future_endpoints(server_state& s, routes& r);
void add_refused_endpoints(server_state& s, routes& r);

/// The OpenAI-compatible endpoints (/v1/completions, /v1/chat/completions, /v1/models), at the
/// root, with OpenAI's error bodies (openai_endpoints.cpp).
void add_openai_endpoints(server_state& s);

/// A 401 in OpenAI's error body, for requests to /v1/ without a valid key.
void reply_openai_unauthorized(httplib::Response& res, const std::string& message);

} // namespace rlforge::service::http
