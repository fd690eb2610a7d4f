#include "backends/weights/shm_transport.hpp"
#include "backends/exception_text.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <thread>

namespace rlforge::backends {

namespace {

constexpr std::uint64_t page_bytes = 4096;
// The segment opens with one control page (ring progress), then the header, then the data.
constexpr std::uint64_t header_offset = page_bytes;

// Ring-mode progress, shared by both processes (lock-free atomics are address-free).
struct ring_control {
  alignas(64) std::atomic<std::uint64_t> written;  // chunks the sender has filled
  alignas(64) std::atomic<std::uint64_t> consumed; // chunks the receiver has drained
  alignas(64) std::atomic<std::uint32_t> verdict;  // see the verdict_* constants
};
static_assert(sizeof(ring_control) <= page_bytes);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
constexpr std::uint32_t verdict_pending = 0;
constexpr std::uint32_t verdict_accepted = 1;
constexpr std::uint32_t verdict_rejected = 2;
constexpr std::uint32_t verdict_aborted = 3; // the receiver gave up mid-stream

ring_control& control_of(void* segment) {
  return *static_cast<ring_control*>(segment);
}

// Waits until `ready()` (yielding the core: the peer needs it) or the deadline passes.
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::steady_clock::time_point deadline) {
  for (std::uint64_t i = 0;; ++i) {
    if (ready())
      return true;
    if ((i & 1023) == 1023 && std::chrono::steady_clock::now() > deadline)
      return false;
    ::sched_yield();
  }
}

// Calls `copy(tensor, offset_in_tensor, offset_in_range, bytes)` for every part of a packed
// tensor inside the layout range [lo, hi). `cursor` indexes `tensors` (sorted by offset) and
// only moves forward, so consecutive ranges cost O(tensors) in total.
template <class Copy>
void for_each_piece(const std::vector<packed_tensor>& tensors, std::size_t& cursor,
                    std::uint64_t lo, std::uint64_t hi, Copy&& copy) {
  while (cursor < tensors.size() && tensors[cursor].offset + tensors[cursor].bytes <= lo)
    ++cursor;
  for (auto i = cursor; i < tensors.size() && tensors[i].offset < hi; ++i) {
    const auto& t = tensors[i];
    auto a = std::max(lo, t.offset);
    auto b = std::min(hi, t.offset + t.bytes);
    if (a < b)
      copy(t, a - t.offset, a - lo, b - a);
  }
}

std::vector<packed_tensor> packed_in_order(const bucket_plan& plan) {
  std::vector<packed_tensor> out;
  for (const auto& b : plan.buckets)
    out.insert(out.end(), b.tensors.begin(), b.tensors.end());
  return out;
}
// Room left in the header area for a later manifest of the same model with a longer version.
constexpr std::uint64_t header_slack = 4096;
// Control messages are small; anything larger is a corrupt stream.
constexpr std::uint32_t max_message_bytes = 64u << 20;

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

std::string ms(std::chrono::milliseconds x) {
  return std::to_string(x.count()) + " ms";
}

std::string unique_segment_name() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  std::uint64_t r = (std::uint64_t(rd()) << 32) ^ rd();
  char buf[96];
  std::snprintf(buf, sizeof buf, "/rlforge_w_%ld_%llu_%016llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(counter++), static_cast<unsigned long long>(r));
  return buf;
}

// One mapping of a shared-memory object; unmapped (and, for the owner, unlinked) on reset.
struct mapping {
  std::string name;
  void* addr = nullptr;
  std::uint64_t bytes = 0;
  bool owner = false;

  char* data() const { return static_cast<char*>(addr); }

  void reset() noexcept {
    if (addr)
      ::munmap(addr, bytes);
    if (owner && !name.empty())
      ::shm_unlink(name.c_str());
    addr = nullptr;
    bytes = 0;
    name.clear();
    owner = false;
  }
};

// -- socket link ---------------------------------------------------------------------------------

enum class message_kind : char { descriptor = 'D', outcome = 'O' };

nlohmann::json to_json(const shm_descriptor& d) {
  nlohmann::json j{{"name", d.name},          {"segment_bytes", d.segment_bytes},
                   {"header_bytes", d.header_bytes}, {"data_offset", d.data_offset},
                   {"data_bytes", d.data_bytes}, {"version", d.version},
                   {"ring_slot_bytes", d.ring_slot_bytes}, {"ring_slots", d.ring_slots}};
  if (!d.cuda_ipc.empty()) {
    j["cuda_ipc"] = d.cuda_ipc;
    j["header"] = d.header;
  }
  return j;
}

nlohmann::json to_json(const shm_outcome& o) {
  return {{"committed", o.committed},
          {"code", static_cast<int>(o.code)},
          {"message", o.message},
          {"version", o.version}};
}

class socket_link final : public shm_link {
public:
  explicit socket_link(int fd) : fd_(fd) {}
  ~socket_link() override { ::close(fd_); }

  void post_descriptor(const shm_descriptor& d) override {
    post(message_kind::descriptor, to_json(d).dump());
  }

  shm_descriptor wait_descriptor(std::chrono::milliseconds timeout) override {
    auto j = wait(message_kind::descriptor, timeout);
    try {
      shm_descriptor d;
      d.name = j.at("name").get<std::string>();
      d.segment_bytes = j.at("segment_bytes").get<std::uint64_t>();
      d.header_bytes = j.at("header_bytes").get<std::uint64_t>();
      d.data_offset = j.at("data_offset").get<std::uint64_t>();
      d.data_bytes = j.at("data_bytes").get<std::uint64_t>();
      d.version = j.at("version").get<std::uint64_t>();
      d.ring_slot_bytes = j.at("ring_slot_bytes").get<std::uint64_t>();
      d.ring_slots = j.at("ring_slots").get<std::uint64_t>();
      d.cuda_ipc = j.value("cuda_ipc", std::string());
      d.header = j.value("header", std::string());
      return d;
    } catch (const nlohmann::json::exception& e) {
      fail(error_code::decode_error, std::string("shm link: malformed descriptor: ") + e.what());
    }
  }

  void post_outcome(const shm_outcome& o) override {
    post(message_kind::outcome, to_json(o).dump());
  }

  shm_outcome wait_outcome(std::chrono::milliseconds timeout) override {
    auto j = wait(message_kind::outcome, timeout);
    try {
      shm_outcome o;
      o.committed = j.at("committed").get<bool>();
      auto code = j.at("code").get<int>();
      if (code < 0 || code > static_cast<int>(error_code::internal))
        fail(error_code::decode_error, "shm link: outcome has unknown error code " +
                                           std::to_string(code));
      o.code = static_cast<error_code>(code);
      o.message = j.at("message").get<std::string>();
      o.version = j.at("version").get<std::uint64_t>();
      return o;
    } catch (const nlohmann::json::exception& e) {
      fail(error_code::decode_error, std::string("shm link: malformed outcome: ") + e.what());
    }
  }

  bool has_message() override {
    pollfd pfd{fd_, POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0;
  }

private:
  void write_all(const char* p, std::size_t n) {
    while (n > 0) {
      auto w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0)
        fail(error_code::io_error, "shm link: send failed (peer gone?): " + errno_text(errno));
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  // Reads exactly n bytes, waiting at most until `deadline` for each chunk.
  void read_all(char* p, std::size_t n, std::chrono::steady_clock::time_point deadline,
                std::chrono::milliseconds timeout) {
    while (n > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd pfd{fd_, POLLIN, 0};
      int ready = ::poll(&pfd, 1, static_cast<int>(std::max<long long>(0, left.count())));
      if (ready < 0 && errno == EINTR)
        continue;
      if (ready < 0)
        fail(error_code::io_error, "shm link: poll failed: " + errno_text(errno));
      if (ready == 0)
        fail(error_code::timeout,
             "shm link: the peer sent nothing within " + ms(timeout) + " (is it running?)");
      auto r = ::recv(fd_, p, n, 0);
      if (r < 0 && errno == EINTR)
        continue;
      if (r < 0)
        fail(error_code::io_error, "shm link: recv failed: " + errno_text(errno));
      if (r == 0)
        fail(error_code::io_error, "shm link: the peer closed the link (did it exit?)");
      p += r;
      n -= static_cast<std::size_t>(r);
    }
  }

  void post(message_kind kind, const std::string& payload) {
    char head[5];
    head[0] = static_cast<char>(kind);
    auto len = static_cast<std::uint32_t>(payload.size());
    std::memcpy(head + 1, &len, sizeof len);
    write_all(head, sizeof head);
    write_all(payload.data(), payload.size());
  }

  nlohmann::json wait(message_kind kind, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char head[5];
    read_all(head, sizeof head, deadline, timeout);
    std::uint32_t len = 0;
    std::memcpy(&len, head + 1, sizeof len);
    if (head[0] != static_cast<char>(kind) || len > max_message_bytes)
      fail(error_code::decode_error, std::string("shm link: expected a ") +
                                         (kind == message_kind::descriptor ? "descriptor"
                                                                           : "outcome") +
                                         " message, got kind '" + std::string(1, head[0]) +
                                         "' of " + std::to_string(len) + " bytes");
    std::string payload(len, '\0');
    read_all(payload.data(), len, deadline, timeout);
    try {
      return nlohmann::json::parse(payload);
    } catch (const nlohmann::json::exception& e) {
      fail(error_code::decode_error, std::string("shm link: message is not JSON: ") + e.what());
    }
  }

  int fd_;
};

} // namespace

shm_link::~shm_link() = default;

std::pair<std::shared_ptr<shm_link>, std::shared_ptr<shm_link>> make_socket_link_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    fail(error_code::io_error, "shm link: socketpair failed: " + errno_text(errno));
  return {std::make_shared<socket_link>(fds[0]), std::make_shared<socket_link>(fds[1])};
}

namespace {

sockaddr_un abstract_address(const std::string& name, socklen_t& length, const char* who) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() > 100 || name.find('\0') != std::string::npos)
    fail(error_code::invalid_argument,
         std::string{who} + ": the link name must be 1-100 bytes without NUL, got "
           + std::to_string(name.size()) + " bytes");
  // A leading NUL selects Linux's abstract namespace: no file is created.
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

int unix_socket(const char* who) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    fail(error_code::io_error, std::string{who} + ": socket failed: " + errno_text(errno));
  return fd;
}

} // namespace

std::shared_ptr<shm_link> listen_socket_link(const std::string& name,
                                             std::chrono::milliseconds timeout) {
  const char* who = "shm link listen";
  socklen_t length = 0;
  auto addr = abstract_address(name, length, who);
  int fd = unix_socket(who);
  auto close_fd = [&] { ::close(fd); };
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), length) != 0 || ::listen(fd, 1) != 0) {
    auto err = errno;
    close_fd();
    fail(error_code::io_error, std::string{who} + ": cannot listen on '" + name
                                 + "': " + errno_text(err));
  }
  pollfd p{fd, POLLIN, 0};
  int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(timeout.count(), 0)));
  if (ready <= 0) {
    auto err = errno;
    close_fd();
    if (ready == 0)
      fail(error_code::timeout, std::string{who} + ": no receiver connected to '" + name
                                  + "' within " + std::to_string(timeout.count()) + " ms");
    fail(error_code::io_error, std::string{who} + ": poll failed: " + errno_text(err));
  }
  int conn = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  auto err = errno;
  close_fd();
  if (conn < 0)
    fail(error_code::io_error, std::string{who} + ": accept failed: " + errno_text(err));
  return std::make_shared<socket_link>(conn);
}

std::shared_ptr<shm_link> connect_socket_link(const std::string& name,
                                              std::chrono::milliseconds timeout) {
  const char* who = "shm link connect";
  socklen_t length = 0;
  auto addr = abstract_address(name, length, who);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int fd = unix_socket(who);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), length) == 0)
      return std::make_shared<socket_link>(fd);
    auto err = errno;
    ::close(fd);
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN)
      fail(error_code::io_error, std::string{who} + ": cannot connect to '" + name
                                   + "': " + errno_text(err));
    if (std::chrono::steady_clock::now() >= deadline)
      fail(error_code::timeout, std::string{who} + ": nobody listened on '" + name
                                  + "' within " + std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// -- sender ------------------------------------------------------------------------------------

struct shm_sender::impl {
  std::shared_ptr<shm_link> link;
  transport_options opts;
  shm_options shm;
  mapping seg;
  std::uint64_t data_offset = 0; // of the current segment

  // Makes sure the segment holds `header_bytes` of header and `data_bytes` of data.
  void ensure(std::uint64_t header_bytes, std::uint64_t data_bytes) {
    if (seg.addr && header_offset + header_bytes <= data_offset &&
        data_offset + data_bytes <= seg.bytes)
      return;
    seg.reset();
    auto offset = align_up(header_offset + header_bytes + header_slack, page_bytes);
    auto bytes = offset + align_up(data_bytes, page_bytes);
    auto name = unique_segment_name();
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
      fail(error_code::io_error, "shm sender: shm_open('" + name + "') failed: " +
                                     errno_text(errno));
    // From here on the name exists: unlink it on every failure path.
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      auto err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      fail(error_code::io_error, "shm sender: sizing segment '" + name + "' to " +
                                     std::to_string(bytes) + " bytes failed: " + errno_text(err));
    }
    // MAP_POPULATE allocates every page now rather than one fault per page in the first copy.
    void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    auto err = errno;
    ::close(fd);
    if (addr == MAP_FAILED) {
      ::shm_unlink(name.c_str());
      fail(error_code::io_error, "shm sender: mapping segment '" + name + "' of " +
                                     std::to_string(bytes) + " bytes failed: " + errno_text(err));
    }
    seg.name = std::move(name);
    seg.addr = addr;
    seg.bytes = bytes;
    seg.owner = true;
    data_offset = offset;
  }
};

shm_sender::shm_sender(std::shared_ptr<shm_link> link, transport_options opts, shm_options shm)
    : impl_(std::make_unique<impl>()) {
  validate(opts, "shm sender");
  if (shm.ring_slot_bytes > 0 && shm.ring_slots < 2)
    fail(error_code::invalid_argument,
         "shm sender: ring_slots must be >= 2 in ring mode, got " + std::to_string(shm.ring_slots));
  impl_->link = std::move(link);
  impl_->opts = opts;
  impl_->shm = shm;
}

shm_sender::~shm_sender() {
  release();
}

void shm_sender::release() noexcept {
  impl_->seg.reset();
}

const std::string& shm_sender::segment_name() const noexcept {
  return impl_->seg.name;
}

shm_descriptor shm_sender::write(const named_tensors& weights, std::uint64_t version) {
  auto& p = *impl_;
  auto sources = detail::sender_sources(weights, version, c10::Device(c10::kCPU), "shm sender");
  auto manifest = make_manifest(sources);
  auto plan = make_bucket_plan(manifest, p.opts.bucket_bytes);
  auto header = encode_transfer_header(manifest, version, p.opts.bucket_bytes);
  p.ensure(header.size(), plan.total_bytes);
  std::memcpy(p.seg.data() + header_offset, header.data(), header.size());
  char* data = p.seg.data() + p.data_offset;
  for (const auto& b : plan.buckets)
    for (const auto& t : b.tensors)
      if (t.bytes > 0)
        std::memcpy(data + t.offset, sources[t.index].second.data_ptr(), t.bytes);
  shm_descriptor d;
  d.name = p.seg.name;
  d.segment_bytes = p.seg.bytes;
  d.header_bytes = header.size();
  d.data_offset = p.data_offset;
  d.data_bytes = plan.total_bytes;
  d.version = version;
  return d;
}

void shm_sender::send(const named_tensors& weights, std::uint64_t version) {
  auto& p = *impl_;
  if (!p.link)
    fail(error_code::unsupported,
         "shm sender: send needs a link; without one use write() and carry the descriptor");
  try {
    if (p.shm.ring_slot_bytes == 0) {
      p.link->post_descriptor(write(weights, version));
    } else {
      stream(weights, version);
    }
    auto o = p.link->wait_outcome(p.opts.timeout);
    if (!o.committed)
      fail(o.code, "shm sender: the receiver did not commit: " + o.message);
  } catch (...) {
    // Whatever failed, no segment outlives the failure.
    release();
    throw;
  }
}

void shm_sender::stream(const named_tensors& weights, std::uint64_t version) {
  auto& p = *impl_;
  auto sources = detail::sender_sources(weights, version, c10::Device(c10::kCPU), "shm sender");
  auto manifest = make_manifest(sources);
  auto plan = make_bucket_plan(manifest, p.opts.bucket_bytes);
  auto header = encode_transfer_header(manifest, version, p.opts.bucket_bytes);
  const auto slot = align_up(p.shm.ring_slot_bytes, tensor_alignment);
  const auto slots = p.shm.ring_slots;
  p.ensure(header.size(), slot * slots);
  std::memcpy(p.seg.data() + header_offset, header.data(), header.size());
  auto& ctl = control_of(p.seg.addr);
  ctl.written.store(0, std::memory_order_relaxed);
  ctl.consumed.store(0, std::memory_order_relaxed);
  ctl.verdict.store(verdict_pending, std::memory_order_release);
  shm_descriptor d;
  d.name = p.seg.name;
  d.segment_bytes = p.seg.bytes;
  d.header_bytes = header.size();
  d.data_offset = p.data_offset;
  d.data_bytes = plan.total_bytes;
  d.version = version;
  d.ring_slot_bytes = slot;
  d.ring_slots = slots;
  p.link->post_descriptor(d);

  auto timeout_error = [&](const char* what) {
    fail(error_code::timeout, std::string("shm sender: ") + what + " within " + ms(p.opts.timeout) +
                                  " (version " + std::to_string(version) + ")");
  };
  auto deadline = std::chrono::steady_clock::now() + p.opts.timeout;
  // A receiver that cannot even map the segment answers on the link only.
  std::uint64_t polls = 0;
  if (!spin_until(
          [&] {
            return ctl.verdict.load(std::memory_order_acquire) != verdict_pending ||
                   ((++polls & 255) == 0 && p.link->has_message());
          },
          deadline))
    timeout_error("the receiver did not validate the manifest");
  if (ctl.verdict.load(std::memory_order_acquire) != verdict_accepted)
    return; // rejected: the outcome on the link says why
  auto packed = packed_in_order(plan);
  std::size_t cursor = 0;
  const auto chunks = (plan.total_bytes + slot - 1) / slot;
  char* ring = p.seg.data() + p.data_offset;
  for (std::uint64_t k = 0; k < chunks; ++k) {
    deadline = std::chrono::steady_clock::now() + p.opts.timeout;
    if (!spin_until(
            [&] {
              return ctl.consumed.load(std::memory_order_acquire) + slots > k ||
                     ctl.verdict.load(std::memory_order_relaxed) == verdict_aborted;
            },
            deadline))
      timeout_error("the receiver stopped draining the ring");
    if (ctl.verdict.load(std::memory_order_relaxed) == verdict_aborted)
      return; // the outcome on the link says why
    auto lo = k * slot;
    auto hi = std::min(plan.total_bytes, lo + slot);
    char* dst = ring + (k % slots) * slot;
    for_each_piece(packed, cursor, lo, hi,
                   [&](const packed_tensor& t, std::uint64_t in_tensor, std::uint64_t in_range,
                       std::uint64_t bytes) {
                     std::memcpy(dst + in_range,
                                 static_cast<const char*>(sources[t.index].second.data_ptr()) +
                                     in_tensor,
                                 bytes);
                   });
    ctl.written.store(k + 1, std::memory_order_release);
  }
}

// -- receiver ----------------------------------------------------------------------------------

struct shm_receiver::impl {
  std::shared_ptr<shm_link> link;
  transport_options opts;
  mapping seg; // the sender's segment, kept mapped between transfers

  void map(const shm_descriptor& d) {
    if (seg.addr && seg.name == d.name && seg.bytes == d.segment_bytes)
      return;
    seg.reset();
    // Read-write: the receiver reports its progress in the control page.
    int fd = ::shm_open(d.name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      auto err = errno;
      fail(err == ENOENT ? error_code::not_found : error_code::io_error,
           "shm receiver: cannot open segment '" + d.name + "': " + errno_text(err) +
               (err == ENOENT ? " (the sender released it, or runs in another namespace)" : ""));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      auto err = errno;
      ::close(fd);
      fail(error_code::io_error, "shm receiver: fstat of '" + d.name + "' failed: " +
                                     errno_text(err));
    }
    if (static_cast<std::uint64_t>(st.st_size) < d.segment_bytes) {
      ::close(fd);
      fail(error_code::invalid_argument,
           "shm receiver: segment '" + d.name + "' has " + std::to_string(st.st_size) +
               " bytes, the descriptor says " + std::to_string(d.segment_bytes));
    }
    void* addr = ::mmap(nullptr, d.segment_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_POPULATE, fd, 0);
    auto err = errno;
    ::close(fd);
    if (addr == MAP_FAILED)
      fail(error_code::io_error, "shm receiver: mapping segment '" + d.name + "' failed: " +
                                     errno_text(err));
    seg.name = d.name;
    seg.addr = addr;
    seg.bytes = d.segment_bytes;
    seg.owner = false;
  }
};

shm_receiver::shm_receiver(std::shared_ptr<shm_link> link, transport_options opts)
    : impl_(std::make_unique<impl>()) {
  validate(opts, "shm receiver");
  impl_->link = std::move(link);
  impl_->opts = opts;
}

shm_receiver::~shm_receiver() {
  impl_->seg.reset();
}

std::uint64_t shm_receiver::apply(const shm_descriptor& d, const named_tensors& targets) {
  auto& p = *impl_;
  auto bad = [&](const std::string& what) {
    fail(error_code::invalid_argument, "shm receiver: descriptor of '" + d.name + "': " + what);
  };
  const bool ring = d.ring_slot_bytes > 0;
  if (d.name.empty())
    bad("empty segment name");
  if (ring && (d.ring_slots < 2 || d.ring_slot_bytes > (std::uint64_t{1} << 40) ||
               d.ring_slots > (std::uint64_t{1} << 20)))
    bad("ring of " + std::to_string(d.ring_slots) + " slots of " +
        std::to_string(d.ring_slot_bytes) + " B is malformed");
  auto area = ring ? d.ring_slot_bytes * d.ring_slots : d.data_bytes;
  if (header_offset + d.header_bytes > d.data_offset || d.data_offset > d.segment_bytes ||
      area > d.segment_bytes - d.data_offset)
    bad("header " + std::to_string(d.header_bytes) + " B, data " + std::to_string(area) +
        " B at offset " + std::to_string(d.data_offset) + " do not fit a segment of " +
        std::to_string(d.segment_bytes) + " B");
  p.map(d);
  auto& ctl = control_of(p.seg.addr);
  transfer_header h;
  bucket_plan plan;
  try {
    h = decode_transfer_header(std::string(p.seg.data() + header_offset, d.header_bytes));
    if (h.version != d.version)
      bad("it announces version " + std::to_string(d.version) +
          ", the segment holds version " + std::to_string(h.version));
    check_transfer(h.manifest, h.version, targets, version_);
    plan = make_bucket_plan(h.manifest, h.bucket_bytes);
    if (plan.total_bytes != d.data_bytes)
      bad("data_bytes " + std::to_string(d.data_bytes) +
          " disagrees with the manifest's layout (" + std::to_string(plan.total_bytes) + " B)");
  } catch (...) {
    if (ring)
      ctl.verdict.store(verdict_rejected, std::memory_order_release);
    throw;
  }
  auto dst = detail::targets_in_manifest_order(h.manifest, targets);
  const char* data = p.seg.data() + d.data_offset;
  if (!ring) {
    // Accepted: the segment is complete, so the copy below cannot fail half-way.
    for (const auto& b : plan.buckets)
      for (const auto& t : b.tensors)
        if (t.bytes > 0)
          std::memcpy(dst[t.index].data_ptr(), data + t.offset, t.bytes);
    version_ = h.version;
    return version_;
  }
  ctl.verdict.store(verdict_accepted, std::memory_order_release);
  auto packed = packed_in_order(plan);
  std::size_t cursor = 0;
  const auto slot = d.ring_slot_bytes;
  const auto chunks = (plan.total_bytes + slot - 1) / slot;
  for (std::uint64_t k = 0; k < chunks; ++k) {
    auto deadline = std::chrono::steady_clock::now() + p.opts.timeout;
    if (!spin_until([&] { return ctl.written.load(std::memory_order_acquire) > k; }, deadline)) {
      ctl.verdict.store(verdict_aborted, std::memory_order_release);
      version_ = 0; // the targets now mix two versions
      fail(error_code::timeout,
           "shm receiver: the sender stopped mid-transfer of version " +
               std::to_string(h.version) + " (no data within " + ms(p.opts.timeout) +
               "); the weights are partly updated, version reset to 0 until a complete transfer");
    }
    auto lo = k * slot;
    auto hi = std::min(plan.total_bytes, lo + slot);
    const char* src = data + (k % d.ring_slots) * slot;
    for_each_piece(packed, cursor, lo, hi,
                   [&](const packed_tensor& t, std::uint64_t in_tensor, std::uint64_t in_range,
                       std::uint64_t bytes) {
                     std::memcpy(static_cast<char*>(dst[t.index].data_ptr()) + in_tensor,
                                 src + in_range, bytes);
                   });
    ctl.consumed.store(k + 1, std::memory_order_release);
  }
  version_ = h.version;
  return version_;
}

std::uint64_t shm_receiver::receive(const named_tensors& targets) {
  auto& p = *impl_;
  if (!p.link)
    fail(error_code::unsupported,
         "shm receiver: receive needs a link; without one call apply() with the descriptor");
  auto d = p.link->wait_descriptor(p.opts.timeout);
  shm_outcome o;
  o.version = version_;
  try {
    apply(d, targets);
  } catch (const error& e) {
    o.code = e.code();
    o.message = e.what();
    p.link->post_outcome(o);
    throw;
  } catch (const std::exception& e) {
    o.code = error_code::internal;
    o.message = exception_first_line(e);
    p.link->post_outcome(o);
    throw;
  }
  o.committed = true;
  o.version = version_;
  p.link->post_outcome(o);
  return version_;
}

} // namespace rlforge::backends
