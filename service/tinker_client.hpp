#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tinker/types.hpp"

namespace rlforge::service {

/// One HTTP answer as `tinker_client` saw it.
struct client_response {
  int status = 0; ///< HTTP status; 0 = no answer (connection failed)
  std::string body;
  std::string content_type;                   ///< the Content-Type header, "" when absent
  std::map<std::string, std::string> headers; ///< every response header (last value wins)
};

/// A call of `tinker_client`'s typed API failed: an HTTP error (`status` >= 400, `message` the
/// server's "error" text), a failed future (`status` 200, `category` set), or no connection
/// (`status` 0).
class client_error : public std::runtime_error {
public:
  client_error(int status, std::string category, const std::string& message);
  int status() const noexcept { return status_; }
  const std::string& category() const noexcept { return category_; }

private:
  int status_;
  std::string category_;
};

/// A small blocking client of the Tinker HTTP API (as the Python SDK 0.25 speaks it) for tests
/// and benchmarks: raw requests with any headers, and typed calls that submit, poll
/// `retrieve_future` until the future is final and decode the result.
///
/// Thread safety: every call opens its own connection, so one client may be used from many
/// threads at once.
class tinker_client {
public:
  /// Talks to `host:port` (HTTP) and sends `api_key` as `X-API-Key` (none when empty).
  tinker_client(std::string host, int port, std::string api_key);

  // ---- raw -----------------------------------------------------------------------------------

  /// POSTs `body` to `/api/v1/<endpoint>` with `content_type` and the extra `headers`.
  client_response post(const std::string& endpoint, const std::string& body,
                       const std::string& content_type = "application/json",
                       const std::map<std::string, std::string>& headers = {}) const;

  /// GETs `/api/v1/<path>` (path may carry a query string); redirects are not followed.
  client_response get(const std::string& path,
                      const std::map<std::string, std::string>& headers = {}) const;

  /// GETs an absolute `http://host:port/...` URL (e.g. an archive Location, or /metrics) with
  /// only the given `headers` (no API key), body streamed into the response.
  client_response get_url(const std::string& url,
                          const std::map<std::string, std::string>& headers = {}) const;

  /// DELETEs `/api/v1/<path>`.
  client_response del(const std::string& path) const;

  /// PUTs `body` (JSON) to `/api/v1/<path>`.
  client_response put(const std::string& path, const std::string& body) const;

  // ---- futures -------------------------------------------------------------------------------

  /// Polls `retrieve_future` until the future is final or `timeout` passes (then throws
  /// client_error status 408). Returns the final answer (a result or `{"error"}`), as the SDK
  /// would see it: `accept_proto` sends `Accept: application/x-protobuf`.
  client_response wait_future(const std::string& request_id, bool accept_proto,
                              std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  /// Extracts "request_id" from a submit answer; throws client_error for an error answer.
  static std::string request_id_of(const client_response& r);

  // ---- typed calls (submit + wait + decode; errors throw client_error) ------------------------

  /// `POST create_session` → session id.
  std::string create_session() const;

  /// `POST create_model` and wait → model id.
  std::string create_model(const std::string& session_id, int64_t model_seq_id,
                           const std::string& base_model, const tinker::lora_config& lora) const;

  /// `POST forward_backward` with a protobuf body; returns the request id.
  std::string submit_forward_backward(const tinker::forward_backward_request& r) const;

  /// Submits and waits; decodes the protobuf result.
  tinker::forward_backward_output forward_backward(const tinker::forward_backward_request& r) const;

  /// `POST optim_step` and wait → metrics.
  std::map<std::string, double> optim_step(const std::string& model_id, int64_t seq_id,
                                           const tinker::adam_params& p) const;

  /// `POST save_weights` and wait → the tinker:// path.
  std::string save_weights(const std::string& model_id, int64_t seq_id,
                           const std::string& name) const;

  /// `POST save_weights_for_sampler` with a name and wait → the tinker:// path.
  std::string save_weights_for_sampler(const std::string& model_id, int64_t seq_id,
                                       const std::string& name) const;

  /// `POST load_weights` and wait.
  void load_weights(const std::string& model_id, int64_t seq_id, const std::string& path,
                    bool optimizer) const;

  /// `POST create_sampling_session` for a tinker:// sampler path, or the base model when
  /// `model_path` is empty → sampling session id.
  std::string create_sampling_session(const std::string& session_id, int64_t seq_id,
                                      const std::string& model_path,
                                      const std::string& base_model) const;

  /// `POST asample` and wait; decodes the protobuf result. `seed` seeds the sampling
  /// (`sampling_params.seed`), for results a test can compare.
  tinker::sample_response sample(const std::string& sampling_session_id, int64_t seq_id,
                                 const std::vector<int64_t>& prompt, int64_t num_samples,
                                 int64_t max_tokens, std::optional<int64_t> seed = {}) const;

  /// The JSON body of an `asample` call (what `sample` sends).
  static std::string sample_body(const std::string& sampling_session_id, int64_t seq_id,
                                 const std::vector<int64_t>& prompt, int64_t num_samples,
                                 int64_t max_tokens, std::optional<int64_t> seed = {});

private:
  std::string host_;
  int port_;
  std::string api_key_;
};

} // namespace rlforge::service
