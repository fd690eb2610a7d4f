#include "backends/collective_group.hpp"
#include "backends/collective_store_state.hpp"
#include "backends/exception_text.hpp"
#include "backends/torch_compat.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef RLFORGE_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "backends/error.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#ifndef USE_C10D_GLOO
#error "rlforge::backends needs libtorch's c10d Gloo (the torch CMake target defines USE_C10D_GLOO)"
#endif

namespace rlforge::backends {

namespace {

using clock_type = std::chrono::steady_clock;
using detail::check_timeout;
using detail::check_world_size;
using detail::ms;

std::shared_ptr<spdlog::logger> logger() {
  static const std::shared_ptr<spdlog::logger> instance = [] {
    const char* name = "backends.collective";
    if (auto existing = spdlog::get(name))
      return existing;
    try {
      return spdlog::stderr_color_mt(name);
    } catch (const spdlog::spdlog_ex&) {
      // Another thread registered it between our lookup and our creation.
      return spdlog::get(name);
    }
  }();
  return instance;
}

long long elapsed_ms(clock_type::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// c10d and Gloo signal timeouts with several different messages ("Wait timeout", "Socket
// Timeout", "Operation timed out!", "Timed out waiting ..."); elapsed time catches the rest.
bool looks_like_timeout(const std::string& what, clock_type::time_point start,
                        std::chrono::milliseconds timeout) {
  auto m = lower(what);
  if (m.find("timeout") != std::string::npos || m.find("timed out") != std::string::npos)
    return true;
  return elapsed_ms(start) >= timeout.count();
}


// Keys of the underlying store under a prefix, and every blocking read bounded by the group's
// timeout: c10d stores default to a 300 s wait, and HashStore::get waits with the store's own
// timeout, not the caller's. Clones (libtorch 2.8+ hands them to gloo's threads) share the record
// of written keys, so `erase_written` removes what any of them wrote.
class bounded_store final : public c10d::Store {
  struct written_keys {
    std::mutex mutex;
    std::vector<std::string> keys;
  };

public:
  bounded_store(c10::intrusive_ptr<c10d::Store> base, std::string prefix,
                std::chrono::milliseconds timeout,
                std::shared_ptr<written_keys> written = std::make_shared<written_keys>())
      : c10d::Store(timeout), base_(std::move(base)), prefix_(std::move(prefix)),
        written_(std::move(written)) {}

#if RLFORGE_C10D_STORE_HAS_CLONE
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<bounded_store>(base_->clone(), prefix_, timeout_, written_);
  }
#endif

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    remember(key);
    base_->set(prefix_ + key, value);
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    remember(key);
    return base_->compareSet(prefix_ + key, expected, desired);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    base_->wait({prefix_ + key}, timeout_);
    return base_->get(prefix_ + key);
  }

  int64_t add(const std::string& key, int64_t value) override {
    remember(key);
    return base_->add(prefix_ + key, value);
  }

  bool deleteKey(const std::string& key) override { return base_->deleteKey(prefix_ + key); }

  bool check(const std::vector<std::string>& keys) override { return base_->check(prefixed(keys)); }

  int64_t getNumKeys() override { return base_->getNumKeys(); }

  void wait(const std::vector<std::string>& keys) override {
    base_->wait(prefixed(keys), timeout_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    // Zero means "no timeout" to c10d; never let a caller wait longer than the group allows.
    auto bound = (timeout.count() <= 0 || timeout > timeout_) ? timeout_ : timeout;
    base_->wait(prefixed(keys), bound);
  }

  /// Deletes every key this rank wrote (best effort), so that a failed rendezvous leaves no
  /// stale address behind for a later attempt under the same prefix.
  void erase_written() {
    std::lock_guard<std::mutex> guard(written_->mutex);
    for (const auto& k : written_->keys) {
      try {
        base_->deleteKey(prefix_ + k);
      } catch (const std::exception&) {
        // The store itself may be what failed; nothing more to clean then.
      }
    }
    written_->keys.clear();
  }

private:
  void remember(const std::string& key) {
    std::lock_guard<std::mutex> guard(written_->mutex);
    auto& keys = written_->keys;
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      keys.push_back(key);
  }

  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys)
      out.push_back(prefix_ + k);
    return out;
  }

  c10::intrusive_ptr<c10d::Store> base_;
  std::string prefix_;
  std::shared_ptr<written_keys> written_;
};

bool supported_dtype(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
  case at::kDouble:
  case at::kHalf:
  case at::kChar:
  case at::kByte:
  case at::kInt:
  case at::kLong:
    return true;
  default:
    return false;
  }
}

} // namespace

// -- collective_group ---------------------------------------------------------------------------

struct collective_group::impl {
  int rank = 0;
  int world_size = 0;
  collective_options opts;
  std::string store_description;
  c10::intrusive_ptr<c10d_backend> pg;
  std::optional<std::string> broken; // the first failure, once there was one

  bool is_gloo() const { return opts.backend == "gloo"; }

  std::string where(const char* op) const {
    return "collective group '" + opts.group_name + "': " + op + " on rank " +
           std::to_string(rank) + " of " + std::to_string(world_size);
  }

  void check_usable(const char* op) const {
    if (broken)
      fail(error_code::backend_error,
           where(op) + ": the group is unusable after an earlier failure: " + *broken);
  }

  void check_root(const char* op, int root) const {
    if (root < 0 || root >= world_size)
      fail(error_code::out_of_range, where(op) + ": root " + std::to_string(root) +
                                         " is outside [0, " + std::to_string(world_size) + ")");
  }

  void check_tensor(const char* op, const at::Tensor& t, std::optional<std::size_t> index) const {
    auto name = index ? "tensor " + std::to_string(*index) : std::string("tensor");
    if (!t.defined())
      fail(error_code::invalid_argument, where(op) + ": " + name + " is undefined");
    if (t.layout() != at::kStrided)
      fail(error_code::invalid_argument,
           where(op) + ": " + name + " is not dense; only strided tensors are supported");
    if (is_gloo() && !t.device().is_cpu())
      fail(error_code::invalid_argument, where(op) + ": " + name + " is on device " +
                                             t.device().str() +
                                             "; the gloo backend takes CPU tensors");
    if (!is_gloo() && !t.device().is_cuda())
      fail(error_code::invalid_argument, where(op) + ": " + name + " is on device " +
                                             t.device().str() +
                                             "; the nccl backend takes CUDA tensors");
    // NCCL also reduces bf16 (a bf16 model's weights and gradients); Gloo here does not.
    if (!supported_dtype(t.scalar_type()) && (is_gloo() || t.scalar_type() != at::kBFloat16))
      fail(error_code::unsupported, where(op) + ": " + name + " has dtype " +
                                        c10::toString(t.scalar_type()) +
                                        ", not one of Half, Float, Double, Char, Byte, Int, Long" +
                                        (is_gloo() ? "" : ", BFloat16"));
    if (at::has_internal_overlap(t) == at::MemOverlap::Yes)
      fail(error_code::invalid_argument,
           where(op) + ": " + name +
               " has elements sharing memory (an expanded view?); pass a tensor owning its data");
  }

  // Issues one c10d operation and waits for it with the group's timeout, turning every c10d or
  // Gloo failure into an `error` and marking the group unusable.
  template <class Issue> void run(const char* op, Issue&& issue) {
    check_usable(op);
    auto start = clock_type::now();
    try {
      auto work = issue();
      work->wait(opts.timeout);
    } catch (const std::exception& e) {
      failed(op, e, start);
    }
  }

  /// Marks the group broken by `e`, thrown by `op` started at `start`, and throws the error.
  [[noreturn]] void failed(const char* op, const std::exception& e, clock_type::time_point start) {
    auto m = exception_first_line(e);
    if (looks_like_timeout(m, start, opts.timeout)) {
      broken = op + std::string(" timed out: ") + m;
      fail(error_code::timeout,
           where(op) + " timed out after " + ms(opts.timeout) +
               " (a peer did not join: collectives must be called in the same order on all "
               "ranks, or a peer died): " +
               m);
    }
    broken = op + std::string(" failed: ") + m;
    fail(error_code::backend_error, where(op) + " failed: " + m);
  }

  void all_reduce_contiguous(at::Tensor& t) {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = opts.timeout;
    run("all_reduce_sum", [&] { return pg->allreduce(v, o); });
  }

  void broadcast_contiguous(at::Tensor& t, int root) {
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = opts.timeout;
    run("broadcast", [&] { return pg->broadcast(v, o); });
  }

  // One collective over one tensor, through a contiguous copy when `t` is not contiguous.
  // `needs_input`: this rank's values go into the collective (not so for a broadcast's
  // receivers); `needs_output`: the result comes back to this rank (not so for its root).
  template <class Op>
  void single(const at::Tensor& t, bool needs_input, bool needs_output, Op&& op) {
    if (t.numel() == 0)
      return;
    c10::NoGradGuard no_grad;
    at::Tensor buf = t;
    if (!t.is_contiguous())
      buf = needs_input ? t.contiguous() : at::empty(t.sizes(), t.options());
    op(buf);
    if (needs_output && !buf.is_same(t))
      t.copy_(buf);
  }

  // Splits `ts` by dtype (in order of first appearance), then greedily into buckets of at most
  // `bucket_bytes`; the result only depends on the list, so every rank forms the same buckets.
  std::vector<std::vector<std::size_t>> buckets(const std::vector<at::Tensor>& ts) const {
    std::vector<std::pair<at::ScalarType, std::vector<std::size_t>>> by_dtype;
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (ts[i].numel() == 0)
        continue;
      auto it = std::find_if(by_dtype.begin(), by_dtype.end(),
                             [&](const auto& g) { return g.first == ts[i].scalar_type(); });
      if (it == by_dtype.end())
        by_dtype.push_back({ts[i].scalar_type(), {i}});
      else
        it->second.push_back(i);
    }
    std::vector<std::vector<std::size_t>> out;
    for (const auto& group : by_dtype) {
      std::vector<std::size_t> cur;
      std::size_t cur_bytes = 0;
      for (auto i : group.second) {
        auto bytes = static_cast<std::size_t>(ts[i].numel()) * ts[i].element_size();
        if (!cur.empty() && cur_bytes + bytes > opts.bucket_bytes) {
          out.push_back(std::move(cur));
          cur.clear();
          cur_bytes = 0;
        }
        cur.push_back(i);
        cur_bytes += bytes;
      }
      if (!cur.empty())
        out.push_back(std::move(cur));
    }
    return out;
  }

  // Runs `op` on each bucket flattened into one contiguous buffer (flags as in `single`).
  template <class Op>
  void bucketed(const std::vector<at::Tensor>& ts, bool needs_input, bool needs_output, Op&& op) {
    c10::NoGradGuard no_grad;
    for (const auto& bucket : buckets(ts)) {
      if (bucket.size() == 1) {
        single(ts[bucket.front()], needs_input, needs_output, op);
        continue;
      }
      int64_t total = 0;
      for (auto i : bucket)
        total += ts[i].numel();
      auto flat = at::empty({total}, ts[bucket.front()].options());
      if (needs_input) {
        int64_t off = 0;
        for (auto i : bucket) {
          flat.narrow(0, off, ts[i].numel()).view(ts[i].sizes()).copy_(ts[i]);
          off += ts[i].numel();
        }
      }
      op(flat);
      if (!needs_output)
        continue;
      int64_t off = 0;
      for (auto i : bucket) {
        ts[i].copy_(flat.narrow(0, off, ts[i].numel()).view(ts[i].sizes()));
        off += ts[i].numel();
      }
    }
  }
};

std::unique_ptr<collective_group> collective_group::create(const store_handle& store, int rank,
                                                           int world_size,
                                                           collective_options opts) {
  const char* what = "collective group rendezvous";
  check_world_size(what, world_size);
  if (rank < 0 || rank >= world_size)
    fail(error_code::out_of_range, std::string(what) + ": rank " + std::to_string(rank) +
                                       " is outside [0, " + std::to_string(world_size) + ")");
  check_timeout(what, opts.timeout);
  if (opts.backend != "gloo" && opts.backend != "nccl")
    fail(error_code::invalid_argument,
         std::string(what) + ": unknown backend '" + opts.backend + "' (expected gloo or nccl)");
#ifndef RLFORGE_WITH_CUDA
  if (opts.backend == "nccl")
    fail(error_code::unsupported,
         std::string(what) + ": backend 'nccl' needs a CUDA build (RLFORGE_WITH_CUDA=ON)");
#endif
  if (opts.interface_host.empty())
    fail(error_code::invalid_argument, std::string(what) + ": interface_host must not be empty");
  if (opts.group_name.empty())
    fail(error_code::invalid_argument, std::string(what) + ": group_name must not be empty");
  if (opts.bucket_bytes == 0)
    fail(error_code::invalid_argument, std::string(what) + ": bucket_bytes must be > 0, got 0");
  if (opts.gloo_connections < 1)
    fail(error_code::invalid_argument, std::string(what) + ": gloo_connections must be >= 1, got " +
                                           std::to_string(opts.gloo_connections));
  if (opts.gloo_threads < 1)
    fail(error_code::invalid_argument, std::string(what) + ": gloo_threads must be >= 1, got " +
                                           std::to_string(opts.gloo_threads));

  auto p = std::make_unique<impl>();
  p->rank = rank;
  p->world_size = world_size;
  p->opts = opts;
  p->store_description = store.description();
  auto who = "collective group '" + opts.group_name + "' rendezvous: rank " + std::to_string(rank) +
             " of " + std::to_string(world_size);

  std::shared_ptr<::gloo::transport::Device> device;
  if (opts.backend == "gloo") {
    try {
      device = c10d::ProcessGroupGloo::createDeviceForHostname(opts.interface_host);
    } catch (const std::exception& e) {
      fail(error_code::invalid_argument,
           who + ": cannot use interface_host '" + opts.interface_host + "': " + exception_first_line(e));
    }
  }

  auto start = clock_type::now();
  // Each rank numbers the groups it builds on this store; with the ordering contract, the n-th
  // group of every rank is the same group, so its keys never meet an earlier group's.
  auto base = store.state()->store;
  auto ns = "rlforge/collective/" + opts.group_name + "/";
  auto generation_key = ns + "generation/" + std::to_string(rank);
  bool numbered = false;
  c10::intrusive_ptr<bounded_store> scoped;
  try {
    auto generation = base->add(generation_key, 1);
    numbered = true;
    scoped = c10::make_intrusive<bounded_store>(base, ns + std::to_string(generation) + "/",
                                                opts.timeout);
    if (opts.backend == "gloo") {
      auto gopts = c10d::ProcessGroupGloo::Options::create(opts.timeout);
      for (int c = 0; c < opts.gloo_connections; ++c)
        gopts->devices.push_back(device);
      gopts->threads = opts.gloo_threads;
      p->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(scoped, rank, world_size, gopts);
    } else {
#ifdef RLFORGE_WITH_CUDA
      // NCCL builds its communicator lazily, at the barrier below, from the same bounded store.
      // Blocking waits make a collective that fails or times out throw here, within the
      // group's timeout, instead of being torn down by libtorch's watchdog (unless the user
      // chose otherwise in the environment).
      ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
      auto nopts = c10d::ProcessGroupNCCL::Options::create();
      nopts->timeout = opts.timeout;
      p->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(scoped, rank, world_size, nopts);
#endif
    }
  } catch (const std::exception& e) {
    auto m = exception_first_line(e);
    // Undo this rank's part: calling create again then meets the peers under the same number.
    if (scoped)
      scoped->erase_written();
    if (numbered) {
      try {
        base->add(generation_key, -1);
      } catch (const std::exception&) {
        // The store itself failed; the error below says so.
      }
    }
    if (looks_like_timeout(m, start, opts.timeout))
      fail(error_code::timeout, who + " timed out after " + ms(opts.timeout) +
                                    " waiting for peers (store: " + p->store_description +
                                    "); every rank in [0, " + std::to_string(world_size) +
                                    ") must call create with the same world size and group "
                                    "name: " +
                                    m);
    fail(error_code::backend_error, who + " failed (store: " + p->store_description + "): " + m);
  }

  try {
    c10d::BarrierOptions bo;
    bo.timeout = opts.timeout;
    p->run("barrier", [&] { return p->pg->barrier(bo); });
  } catch (const error& e) {
    fail(e.code(), who + ": the barrier after the rendezvous failed: " + e.what());
  }
  logger()->debug("collective group created group={} rank={} world_size={} backend={} store={} "
                  "elapsed_ms={}",
                  opts.group_name, rank, world_size, opts.backend, p->store_description,
                  elapsed_ms(start));
  return std::unique_ptr<collective_group>(new collective_group(std::move(p)));
}

collective_group::collective_group(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

collective_group::~collective_group() = default;

int collective_group::rank() const noexcept {
  return impl_->rank;
}

int collective_group::world_size() const noexcept {
  return impl_->world_size;
}

const collective_options& collective_group::options() const noexcept {
  return impl_->opts;
}

void collective_group::all_reduce_sum(const at::Tensor& t) {
  const char* op = "all_reduce_sum";
  impl_->check_usable(op);
  impl_->check_tensor(op, t, std::nullopt);
  impl_->single(t, true, true, [&](at::Tensor& buf) { impl_->all_reduce_contiguous(buf); });
}

void collective_group::all_reduce_sum(const std::vector<at::Tensor>& ts) {
  const char* op = "all_reduce_sum";
  impl_->check_usable(op);
  for (std::size_t i = 0; i < ts.size(); ++i)
    impl_->check_tensor(op, ts[i], i);
  impl_->bucketed(ts, true, true, [&](at::Tensor& buf) { impl_->all_reduce_contiguous(buf); });
}

void collective_group::broadcast(const at::Tensor& t, int root) {
  const char* op = "broadcast";
  impl_->check_usable(op);
  impl_->check_root(op, root);
  impl_->check_tensor(op, t, std::nullopt);
  impl_->single(t, impl_->rank == root, impl_->rank != root,
                [&](at::Tensor& buf) { impl_->broadcast_contiguous(buf, root); });
}

void collective_group::broadcast(const std::vector<at::Tensor>& ts, int root) {
  const char* op = "broadcast";
  impl_->check_usable(op);
  impl_->check_root(op, root);
  for (std::size_t i = 0; i < ts.size(); ++i)
    impl_->check_tensor(op, ts[i], i);
  impl_->bucketed(ts, impl_->rank == root, impl_->rank != root,
                  [&](at::Tensor& buf) { impl_->broadcast_contiguous(buf, root); });
}

void collective_group::broadcast_pipelined(std::size_t count,
                                           const std::function<at::Tensor(std::size_t)>& next,
                                           int root, std::size_t depth) {
  const char* op = "broadcast";
  impl_->check_usable(op);
  impl_->check_root(op, root);
  if (depth < 1)
    fail(error_code::invalid_argument, impl_->where(op) + ": pipeline depth must be >= 1");
  c10::NoGradGuard no_grad;
  struct in_flight {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor; // kept alive until its broadcast completed
  };
  std::deque<in_flight> pending;
  auto start = clock_type::now();
  // Waits out every broadcast still on Gloo's threads before an error unwinds (their tensors
  // must outlive them); their own errors are dropped: the first failure is the one reported.
  auto drain = [&] {
    for (; !pending.empty(); pending.pop_front())
      try {
        pending.front().work->wait(impl_->opts.timeout);
      } catch (const std::exception&) {
      }
  };
  auto wait_oldest = [&] {
    try {
      pending.front().work->wait(impl_->opts.timeout);
    } catch (const std::exception& e) {
      pending.pop_front();
      drain();
      impl_->failed(op, e, start);
    }
    pending.pop_front();
  };
  for (std::size_t i = 0; i < count; ++i) {
    while (pending.size() >= depth)
      wait_oldest();
    at::Tensor t;
    try {
      t = next(i);
      impl_->check_tensor(op, t, i);
      if (!t.is_contiguous())
        fail(error_code::invalid_argument,
             impl_->where(op) + ": tensor " + std::to_string(i) +
                 " of a pipelined broadcast must be contiguous");
    } catch (...) {
      drain();
      throw;
    }
    if (t.numel() == 0)
      continue;
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = impl_->opts.timeout;
    try {
      pending.push_back({impl_->pg->broadcast(v, o), t});
    } catch (const std::exception& e) {
      drain();
      impl_->failed(op, e, start);
    }
  }
  while (!pending.empty())
    wait_oldest();
}

void collective_group::barrier() {
  c10d::BarrierOptions bo;
  bo.timeout = impl_->opts.timeout;
  impl_->run("barrier", [&] { return impl_->pg->barrier(bo); });
}

} // namespace rlforge::backends
