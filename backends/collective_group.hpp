#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rlforge::backends {

namespace detail {
struct store_state;
} // namespace detail

/// Which kind of rendezvous store a `store_handle` refers to.
enum class store_kind {
  in_process, ///< a map shared by ranks that are threads of one process
  tcp,        ///< a TCP server hosted by one rank (usually rank 0), the others connect
  file,       ///< a file on a file system every rank can see
  external,   ///< served outside this library, through a `key_value_store`
};

/// Returns the enumerator's name, e.g. "in_process".
const char* to_string(store_kind x) noexcept;

/// A rendezvous store (c10d vocabulary): the key-value store through which the ranks of a
/// collective group find each other. Copies of a handle share one store; a store may serve many
/// groups in turn. Handles are cheap to copy and safe to use from several threads at once.
class store_handle {
public:
  /// Wraps store state built by one of the `make_*_store` factories (not for direct use).
  explicit store_handle(std::shared_ptr<detail::store_state> state);

  /// The kind of store.
  store_kind kind() const noexcept;

  /// For a TCP store: the port its server listens on (the one the OS picked when the server
  /// was created with port 0). 0 for the other kinds.
  std::uint16_t port() const noexcept;

  /// One line naming the store, e.g. "tcp 127.0.0.1:41234 (server)" or "in-process".
  std::string description() const;

  /// The shared state (for `collective_group`).
  const std::shared_ptr<detail::store_state>& state() const noexcept { return state_; }

private:
  std::shared_ptr<detail::store_state> state_;
};

/// A store shared by ranks that are threads in this process (a c10d HashStore): hand a copy of
/// the same handle to every rank. This is how the ranks of an actor group living in one
/// process rendezvous.
store_handle make_in_process_store();

/// A TCP store. The server side (`is_server`, normally on rank 0) listens on `host:port`;
/// `port` 0 lets the OS pick a free port, readable afterwards with `store_handle::port()`.
/// Clients connect to `host:port` (port must then be non-zero), retrying until `timeout`.
/// `world_size` is the number of ranks that will use the store (>= 1). Throws
/// `error{invalid_argument}` for a bad argument and `error{timeout}` when a client cannot
/// reach the server within `timeout`.
store_handle make_tcp_store(const std::string& host, std::uint16_t port, bool is_server,
                            int world_size, std::chrono::milliseconds timeout);

/// A store kept in the file `path`, shared by `world_size` ranks (>= 1) that each open it; the
/// file is removed when the last of them closes it. Throws `error{invalid_argument}` for a bad
/// argument and `error{io_error}` when the file cannot be opened.
store_handle make_file_store(const std::string& path, int world_size);

/// A rendezvous store served outside this library: rlforge's runtime serves one from an actor
/// (actors/rendezvous_store.hpp) that ranks reach over the cluster's authenticated connections.
/// The operations are c10d's: values are bytes; `add` keeps a decimal integer. Every call blocks
/// until answered and throws `error` on failure (`timeout` when a wait ran out, naming the
/// keys). Implementations must be safe to call from several threads at once.
class key_value_store {
public:
  virtual ~key_value_store() = default;
  virtual void set(const std::string& key, const std::vector<std::uint8_t>& value) = 0;
  /// Waits up to `timeout` for `key`, then returns its value.
  virtual std::vector<std::uint8_t> get(const std::string& key,
                                        std::chrono::milliseconds timeout) = 0;
  /// Adds `delta` to the integer at `key` (0 when absent); returns the sum.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  /// Sets `desired` when the value is `expected` (or absent and `expected` empty); returns the
  /// value now stored.
  virtual std::vector<std::uint8_t> compare_set(const std::string& key,
                                                const std::vector<std::uint8_t>& expected,
                                                const std::vector<std::uint8_t>& desired) = 0;
  /// Whether every key is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// Waits up to `timeout` until every key is set.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// Removes `key`; returns whether it was set.
  virtual bool erase(const std::string& key) = 0;
  /// The number of keys.
  virtual std::int64_t count() = 0;
  /// One line naming the store, for error messages.
  virtual std::string description() const = 0;
};

/// A store whose operations `kv` serves (throws `error{invalid_argument}` for a null `kv`).
store_handle make_external_store(std::shared_ptr<key_value_store> kv);

/// How a collective group is built.
struct collective_options {
  /// "gloo" (CPU tensors) or "nccl" (CUDA tensors, only in a build with RLFORGE_WITH_CUDA).
  std::string backend = "gloo";
  /// Bound on the rendezvous, on the barrier that ends `create`, and on every collective.
  std::chrono::milliseconds timeout{30000};
  /// Address (or host name) Gloo binds its connections to on this rank.
  std::string interface_host = "127.0.0.1";
  /// Names the group in store keys and in error messages. Ranks of one group must agree.
  std::string group_name = "default";
  /// Size limit of one flattened bucket in the multi-tensor collectives.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Gloo worker threads per group.
  int gloo_threads = 2;
  /// Gloo TCP connections to each peer (one Gloo device each). Successive collectives take them
  /// in turn, so asynchronous ones (`broadcast_pipelined`) travel on several at once.
  int gloo_connections = 1;
};

/// One rank's membership of a group of `world_size` ranks that run collectives together
/// (c10d ProcessGroupGloo underneath; ProcessGroupNCCL in a CUDA build).
///
/// Ordering contract: collectives must be called in the same order, with tensors of the same
/// shapes and dtypes, on all ranks of the group. A rank that skips a call makes its peers time
/// out. Multi-tensor calls must get the same list (same order, shapes, dtypes) on every rank.
///
/// Thread contract: one object is used by one thread at a time (the rank that owns it, usually
/// a detached actor); it is not safe to call two collectives on the same object concurrently.
/// Objects for different ranks, in one process or not, run concurrently.
///
/// Failures: every call throws `error`. `timeout` when peers do not join within the timeout;
/// `backend_error` for any other c10d / Gloo failure; `invalid_argument`, `out_of_range` or
/// `unsupported` for bad input, before anything is sent. After a timeout or a backend error the
/// group is unusable: later calls throw `backend_error` naming the first failure. Destroying a
/// group whose collective timed out can block until Gloo's own timeout (the same value) ends
/// the operation in flight.
class collective_group {
public:
  /// Joins the group: rendezvous through `store`, then a barrier, each bounded by
  /// `opts.timeout`. Every rank in [0, world_size) must call it with the same `world_size` and
  /// `opts.group_name`; groups built on one store by the same ranks must be created in the
  /// same order on each rank. A rank whose rendezvous failed over an in-process or file store
  /// leaves nothing behind and may call `create` again on it to retry; after a failure over a
  /// TCP store, retry on a new store (the old connection may still time out). Throws `error{timeout}` when a peer does not show up in time,
  /// `error{invalid_argument}` / `error{out_of_range}` / `error{unsupported}` for bad
  /// arguments.
  static std::unique_ptr<collective_group> create(const store_handle& store, int rank,
                                                  int world_size, collective_options opts = {});

  ~collective_group();
  collective_group(const collective_group&) = delete;
  collective_group& operator=(const collective_group&) = delete;

  /// This rank, in [0, world_size()).
  int rank() const noexcept;

  /// Number of ranks in the group.
  int world_size() const noexcept;

  /// The options the group was built with.
  const collective_options& options() const noexcept;

  /// Replaces `t`'s values, on every rank, by the element-wise sum over all ranks. A
  /// non-contiguous tensor is reduced through a contiguous copy and written back in place.
  /// Supported dtypes: float16/32/64, int8, uint8, int32, int64.
  void all_reduce_sum(const at::Tensor& t);

  /// Same for several tensors, flattened into buckets of at most `bucket_bytes` per dtype (a
  /// tensor larger than that travels alone), one collective per bucket.
  void all_reduce_sum(const std::vector<at::Tensor>& ts);

  /// Copies `root`'s values of `t` into `t` on every other rank.
  void broadcast(const at::Tensor& t, int root);

  /// Same for several tensors, bucketed as `all_reduce_sum(ts)`.
  void broadcast(const std::vector<at::Tensor>& ts, int root);

  /// Broadcasts `count` contiguous tensors from `root`, in order, with up to `depth` of them on
  /// the wire at once: `next(i)` is called on this thread for the i-th tensor once at most
  /// `depth - 1` earlier ones are still in flight, so the root can pack tensor i while tensors
  /// i-depth+1 .. i-1 travel (Gloo's threads move them). The tensor `next(i - depth)` returned
  /// is no longer in use when `next(i)` is called (a buffer may be reused every `depth` calls).
  /// Every rank must make the same calls with tensors of the same shapes and dtypes. Returns
  /// once all completed; failures as for `broadcast`. Throws `error{invalid_argument}` for a
  /// depth of 0 or a non-contiguous tensor.
  void broadcast_pipelined(std::size_t count, const std::function<at::Tensor(std::size_t)>& next,
                           int root, std::size_t depth = 2);

  /// Returns once every rank has reached the barrier (and its earlier collectives finished).
  void barrier();

  struct impl;

private:
  explicit collective_group(std::unique_ptr<impl> p);

  std::unique_ptr<impl> impl_;
};

} // namespace rlforge::backends
