#include "service/http_server.hpp"

#include <sys/socket.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <utility>

#include "service/http/server_state.hpp"

namespace rlforge::service {

using namespace http;

bool constant_time_equal(const std::string& presented, const std::string& expected) {
  // Walk the expected string's length whatever was presented, so timing reveals neither the
  // position of the first difference nor (beyond "longer or not") the length.
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

namespace {

void check_options(const server_options& opts) {
  if (opts.api_key.empty() && !opts.insecure_no_auth)
    throw std::invalid_argument("http_server: api_key is empty (set one, or insecure_no_auth to "
                                "serve without authentication)");
  if (opts.checkpoint_dir.empty())
    throw std::invalid_argument("http_server: checkpoint_dir is empty");
  if (opts.long_poll_hold.count() <= 0)
    throw std::invalid_argument("http_server: long_poll_hold must be > 0 ms");
  if (opts.http_threads == 0)
    throw std::invalid_argument("http_server: http_threads must be >= 1");
  if (opts.max_body_bytes == 0)
    throw std::invalid_argument("http_server: max_body_bytes must be >= 1");
  if (opts.max_num_samples < 1)
    throw std::invalid_argument("http_server: max_num_samples must be >= 1, got " +
                                std::to_string(opts.max_num_samples));
  if (opts.stream_chunk_tokens < 1)
    throw std::invalid_argument("http_server: stream_chunk_tokens must be >= 1, got " +
                                std::to_string(opts.stream_chunk_tokens));
  if (opts.port < 0 || opts.port > 65535)
    throw std::invalid_argument("http_server: port must be in 0..65535, got " +
                                std::to_string(opts.port));
}

/// Authentication before routing: every endpoint but healthz and archive downloads (which carry
/// their own short-lived token) needs the API key.
void add_authentication(server_state& s) {
  s.svr.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/api/v1/healthz" || req.path.rfind("/api/v1/checkpoint_archives/", 0) == 0 ||
        s.opts.insecure_no_auth)
      return httplib::Server::HandlerResponse::Unhandled;
    auto refuse = [&](const std::string& why) {
      res.set_header("Connection", "close");
      if (req.path.rfind("/v1/", 0) == 0)
        reply_openai_unauthorized(res, why);
      else
        reply_error(res, 401, why);
      count_request(s, "unauthenticated", 401);
      return httplib::Server::HandlerResponse::Handled;
    };
    // The Tinker SDK sends X-API-Key; OpenAI clients and Prometheus send a bearer token.
    const std::string bearer = "Bearer ";
    const auto authorization = req.get_header_value("Authorization");
    if (req.has_header("X-API-Key")) {
      if (!constant_time_equal(req.get_header_value("X-API-Key"), s.opts.api_key))
        return refuse("invalid API key");
    } else if (authorization.rfind(bearer, 0) == 0) {
      if (!constant_time_equal(authorization.substr(bearer.size()), s.opts.api_key))
        return refuse("invalid API key");
    } else {
      return refuse("missing API key: send header X-API-Key: KEY or Authorization: Bearer KEY");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  httplib::Server::HandlerWithResponse on_error = [&s](const httplib::Request& req,
                                                       httplib::Response& res) {
    if (!res.body.empty())
      return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 413)
      reply_error(res, 413,
                  "request body larger than the limit of " + std::to_string(s.opts.max_body_bytes) +
                      " bytes");
    else if (res.status == 404) {
      reply_error(res, 404, "no endpoint " + req.method + " " + req.path);
      count_request(s, "unknown", 404);
    }
    else
      reply_error(res, res.status, "HTTP " + std::to_string(res.status));
    return httplib::Server::HandlerResponse::Handled;
  };
  s.svr.set_error_handler(std::move(on_error));
}

/// A handler whose exceptions become error replies (`current_http_failure`), counted in the
/// metrics.
httplib::Server::Handler guarded(server_state& s, const std::string& route, handler fn) {
  return [&s, endpoint = endpoint_label(route),
          fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
    try {
      fn(req, res);
    } catch (...) {
      auto f = current_http_failure(s, req);
      reply_error(res, f.status, f.message);
    }
    finish_request(s, req, res, endpoint);
  };
}

} // namespace

http_server::http_server(server_options opts, actors::tinker_backend& backend,
                         future_store& store) {
  check_options(opts);
  state_ = std::make_unique<server_state>(std::move(opts), backend, store);
  auto& s = *state_;
  s.limits.max_body_bytes = s.opts.max_body_bytes;
  s.sched = std::make_unique<request_scheduler>(
      s.opts.scheduler,
      [&backend, &s](const std::vector<tinker::forward_backward_request>& batch) {
        auto out = backend.forward_backward(batch);
        double tokens = 0;
        for (const auto& r : batch)
          for (const auto& d : r.data)
            tokens += static_cast<double>(d.tokens.size());
        count_tokens(s, batch.front().forward_only ? "scored" : "trained", tokens);
        return out;
      },
      [&backend, &s](const std::vector<tinker::sample_request>& requests) {
        auto out = backend.sample(requests);
        double tokens = 0;
        for (const auto& r : out)
          for (const auto& q : r.sequences)
            tokens += static_cast<double>(q.tokens.size());
        count_tokens(s, "generated", tokens);
        return out;
      });

  auto& svr = s.svr;
  size_t threads = s.opts.http_threads;
  // cpp-httplib takes ownership of the queue it gets from this factory.
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(s.opts.max_body_bytes);
  svr.set_tcp_nodelay(true);
  // cpp-httplib's default also sets SO_REUSEPORT, which lets a second server bind a port in use
  // and silently share its connections: only SO_REUSEADDR (restart while TIME_WAIT lingers).
  svr.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  svr.set_keep_alive_max_count(10000);
  svr.set_keep_alive_timeout(5);
  add_authentication(s);

  routes r;
  r.post = [&s](const std::string& path, handler fn) {
    s.svr.Post(std::string(api) + path, guarded(s, path, std::move(fn)));
  };
  r.get = [&s](const std::string& path, handler fn) {
    s.svr.Get(std::string(api) + path, guarded(s, path, std::move(fn)));
  };
  r.put = [&s](const std::string& path, handler fn) {
    s.svr.Put(std::string(api) + path, guarded(s, path, std::move(fn)));
  };
  r.del = [&s](const std::string& path, handler fn) {
    s.svr.Delete(std::string(api) + path, guarded(s, path, std::move(fn)));
  };
  add_session_endpoints(s, r);
  add_training_endpoints(s, r);
  add_checkpoint_endpoints(s, r);
  add_sampling_endpoints(s, r);
  add_future_endpoints(s, r);
  add_refused_endpoints(s, r);
  add_metrics_endpoint(s, [&s](const std::string& path, handler fn) {
    s.svr.Get(path, guarded(s, path, std::move(fn)));
  });
  add_openai_endpoints(s);
}

http_server::~http_server() {
  stop();
}

int http_server::start() {
  auto& s = *state_;
  if (s.started)
    throw std::runtime_error("http_server: start called twice");
  fs::create_directories(s.opts.checkpoint_dir);
  int port = s.opts.port;
  if (port == 0) {
    port = s.svr.bind_to_any_port(s.opts.host);
    if (port <= 0)
      throw std::runtime_error("http_server: cannot bind " + s.opts.host + " on an ephemeral port");
  } else if (!s.svr.bind_to_port(s.opts.host, port)) {
    throw std::runtime_error("http_server: cannot bind " + s.opts.host + ":" +
                             std::to_string(port) + " (in use, or not a local address?)");
  }
  s.bound_port = port;
  s.started = true;
  s.started_seconds = future_store::now_ms() / 1000;
  s.listener = std::thread([&s] { s.svr.listen_after_bind(); });
  // cpp-httplib's stop() does nothing until the accept loop runs: wait for it, so that a stop()
  // right after start() cannot leave the loop running forever.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!s.svr.is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      s.svr.stop();
      s.listener.join();
      throw std::runtime_error("http_server: the accept loop on " + s.opts.host + ":" +
                               std::to_string(port) + " did not start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  s.log->info("event=listening host={} port={} auth={}", s.opts.host, port,
              s.opts.insecure_no_auth ? "off" : "api_key");
  return port;
}

int http_server::port() const {
  return state_->bound_port;
}

void http_server::wait() {
  auto& s = *state_;
  std::unique_lock<std::mutex> lock(s.poll_mutex);
  s.stopped_cv.wait(lock, [&] { return s.stopped; });
}

void http_server::stop() {
  auto& s = *state_;
  {
    std::lock_guard<std::mutex> guard(s.poll_mutex);
    if (s.stopped)
      return;
    s.stopping = true;
  }
  s.poll_cv.notify_all();
  if (s.started) {
    s.svr.stop();
    if (s.listener.joinable())
      s.listener.join();
  }
  s.sched.reset();
  {
    std::lock_guard<std::mutex> guard(s.poll_mutex);
    s.stopped = true;
  }
  s.stopped_cv.notify_all();
}

} // namespace rlforge::service
