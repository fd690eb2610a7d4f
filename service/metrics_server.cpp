#include "service/metrics_server.hpp"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "runtime/prometheus_text.hpp"

namespace rlforge::service {

struct metrics_server::impl {
  std::function<std::string()> render;
  std::mutex render_mutex;
  httplib::Server svr;
  std::thread listener;
};

metrics_server::metrics_server(std::function<std::string()> render) : impl_(new impl) {
  impl_->render = std::move(render);
  auto& p = *impl_;
  p.svr.new_task_queue = [] { return new httplib::ThreadPool(2); };
  p.svr.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  p.svr.Get("/metrics", [&p](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> guard(p.render_mutex);
    try {
      res.set_content(p.render(), runtime::metrics_registry::content_type());
    } catch (const std::exception& e) {
      res.status = 503;
      res.set_content(std::string("metrics unavailable: ") + e.what() + "\n", "text/plain");
    }
  });
}

metrics_server::~metrics_server() {
  stop();
}

int metrics_server::start(const std::string& host, int port) {
  auto& p = *impl_;
  int bound = port == 0 ? p.svr.bind_to_any_port(host) : (p.svr.bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    throw std::runtime_error("cannot serve metrics on " + host + ":" + std::to_string(port) +
                             " (in use, or not a local address?)");
  p.listener = std::thread([&p] { p.svr.listen_after_bind(); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!p.svr.is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void metrics_server::stop() {
  auto& p = *impl_;
  if (p.listener.joinable()) {
    p.svr.stop();
    p.listener.join();
  }
}

} // namespace rlforge::service
