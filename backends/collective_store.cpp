// The rendezvous stores of collective groups (collective_group.hpp): in-process, TCP, file and
// external ones, each behind a `store_handle`.
#include "backends/collective_group.hpp"
#include "backends/collective_store_state.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backends/error.hpp"
#include "backends/exception_text.hpp"
#include "backends/torch_compat.hpp"

namespace rlforge::backends {

namespace detail {

std::string ms(std::chrono::milliseconds x) {
  return std::to_string(x.count()) + " ms";
}

void check_timeout(const char* what, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    fail(error_code::invalid_argument,
         std::string(what) + ": timeout must be > 0 ms, got " + ms(timeout));
}

void check_world_size(const char* what, int world_size) {
  if (world_size < 1)
    fail(error_code::invalid_argument,
         std::string(what) + ": world_size must be >= 1, got " + std::to_string(world_size));
}

} // namespace detail

namespace {

using clock_type = std::chrono::steady_clock;
using detail::check_timeout;
using detail::check_world_size;
using detail::ms;

// Pauses between attempts of a TCP store client to reach its server: doubling, capped.
constexpr std::chrono::milliseconds first_retry_pause{50};
constexpr std::chrono::milliseconds max_retry_pause{500};

// c10d's view of a `key_value_store`. c10d calls `get` and the one-argument `wait` with the
// store's own timeout; the group's `bounded_store` above bounds them by the group's.
class external_store final : public c10d::Store {
public:
  explicit external_store(std::shared_ptr<key_value_store> kv) : kv_(std::move(kv)) {}

#if RLFORGE_C10D_STORE_HAS_CLONE
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<external_store>(kv_);
  }
#endif

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    kv_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return kv_->compare_set(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override { return kv_->get(key, timeout_); }
  int64_t add(const std::string& key, int64_t value) override { return kv_->add(key, value); }
  bool deleteKey(const std::string& key) override { return kv_->erase(key); }
  bool check(const std::vector<std::string>& keys) override { return kv_->check(keys); }
  int64_t getNumKeys() override { return kv_->count(); }
  void wait(const std::vector<std::string>& keys) override { kv_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    kv_->wait(keys, timeout.count() <= 0 ? timeout_ : timeout);
  }

private:
  std::shared_ptr<key_value_store> kv_;
};

} // namespace

// -- store_handle -------------------------------------------------------------------------------

const char* to_string(store_kind x) noexcept {
  switch (x) {
  case store_kind::in_process:
    return "in_process";
  case store_kind::tcp:
    return "tcp";
  case store_kind::file:
    return "file";
  case store_kind::external:
    return "external";
  }
  return "unknown";
}

store_handle::store_handle(std::shared_ptr<detail::store_state> state) : state_(std::move(state)) {
  if (!state_ || !state_->store)
    fail(error_code::invalid_argument, "store_handle: empty store state");
}

store_kind store_handle::kind() const noexcept {
  return state_->kind;
}

std::uint16_t store_handle::port() const noexcept {
  return state_->port;
}

std::string store_handle::description() const {
  return state_->description;
}

store_handle make_in_process_store() {
  auto st = std::make_shared<detail::store_state>();
  st->kind = store_kind::in_process;
  st->description = "in-process";
  st->store = c10::make_intrusive<c10d::HashStore>();
  return store_handle{std::move(st)};
}

store_handle make_tcp_store(const std::string& host, std::uint16_t port, bool is_server,
                            int world_size, std::chrono::milliseconds timeout) {
  const char* what = "tcp store";
  if (host.empty())
    fail(error_code::invalid_argument, "tcp store: host must not be empty");
  check_world_size(what, world_size);
  check_timeout(what, timeout);
  if (!is_server && port == 0)
    fail(error_code::invalid_argument,
         "tcp store: a client needs the server's port, got port 0 (only a server may ask the OS "
         "for a free port)");
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = is_server;
  o.numWorkers = static_cast<std::size_t>(world_size);
  // Waiting for workers here would block the server's constructor, i.e. deadlock ranks that
  // are threads created one after another; the group's rendezvous waits for them instead.
  o.waitWorkers = false;
  o.timeout = timeout;
  auto start = clock_type::now();
  auto deadline = start + timeout;
  auto endpoint = host + ":" + std::to_string(port);
  auto retry_pause = first_retry_pause;
  // c10d gives up on a refused connection at once; a client started before its server (ranks
  // launched in any order) retries until the deadline instead.
  for (;;) {
    try {
      auto st = std::make_shared<detail::store_state>();
      auto tcp = c10::make_intrusive<c10d::TCPStore>(host, o);
      st->kind = store_kind::tcp;
      st->port = tcp->getPort();
      st->description =
          "tcp " + host + ":" + std::to_string(st->port) + (is_server ? " (server)" : " (client)");
      st->store = std::move(tcp);
      return store_handle{std::move(st)};
    } catch (const std::exception& e) {
      auto m = exception_first_line(e);
      if (is_server)
        fail(error_code::io_error, "tcp store: cannot serve on " + endpoint + ": " + m);
      auto now = clock_type::now();
      if (now < deadline) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
        std::this_thread::sleep_for(std::min(retry_pause, left));
        retry_pause = std::min(retry_pause * 2, max_retry_pause);
        // Never 0: c10d reads a zero timeout as "wait forever".
        o.timeout = std::max(
            std::chrono::milliseconds(1),
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()));
        continue;
      }
      fail(error_code::timeout, "tcp store: could not reach the server at " + endpoint +
                                    " within " + ms(timeout) + " (is rank 0 up?): " + m);
    }
  }
}

store_handle make_file_store(const std::string& path, int world_size) {
  const char* what = "file store";
  if (path.empty())
    fail(error_code::invalid_argument, "file store: path must not be empty");
  check_world_size(what, world_size);
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
    fail(error_code::io_error,
         "file store: directory '" + parent.string() + "' of '" + path + "' does not exist");
  try {
    auto st = std::make_shared<detail::store_state>();
    st->kind = store_kind::file;
    st->description = "file " + path;
    st->store = c10::make_intrusive<c10d::FileStore>(path, world_size);
    return store_handle{std::move(st)};
  } catch (const std::exception& e) {
    fail(error_code::io_error, "file store: cannot open '" + path + "': " + exception_first_line(e));
  }
}

store_handle make_external_store(std::shared_ptr<key_value_store> kv) {
  if (!kv)
    fail(error_code::invalid_argument, "external store: no key_value_store given");
  auto st = std::make_shared<detail::store_state>();
  st->kind = store_kind::external;
  st->description = kv->description();
  st->store = c10::make_intrusive<external_store>(std::move(kv));
  return store_handle{std::move(st)};
}
} // namespace rlforge::backends
