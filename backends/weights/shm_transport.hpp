#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "backends/error.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

/// Where a transfer waits in shared memory: plain data, small enough to ride in a message
/// (a CAF message between a trainer and an engine on one node, or an `shm_link`).
struct shm_descriptor {
  std::string name;                ///< POSIX shared-memory object name, e.g. "/rlforge_w_..."
  std::uint64_t segment_bytes = 0; ///< size of the whole segment
  std::uint64_t header_bytes = 0;  ///< length of the transfer header (JSON), after the 4 KiB
                                   ///< control page that opens the segment
  std::uint64_t data_offset = 0;   ///< where the packed buckets begin (page aligned)
  std::uint64_t data_bytes = 0;    ///< size of the packed layout (bucket_plan::total_bytes)
  std::uint64_t version = 0;       ///< the version being transferred
  /// 0: the data area holds the whole layout, fully written. Otherwise the layout streams
  /// through a ring of `ring_slots` slots of this many bytes at `data_offset`.
  std::uint64_t ring_slot_bytes = 0;
  std::uint64_t ring_slots = 0;
  /// CUDA IPC transfers only (cuda_ipc_transport.hpp), where `name` is empty: where each
  /// tensor lies in the sender's device memory (JSON: the device, the memory handles, per
  /// tensor its handle and byte offset) and the transfer header (`encode_transfer_header`).
  std::string cuda_ipc;
  std::string header;
};

/// How `shm_sender::send` moves the packed layout.
struct shm_options {
  /// 0: whole-segment mode, the segment holds the whole layout and is written completely
  /// before the receiver reads (atomic commit even if the sender dies; segment as large as
  /// the model; two full copies one after the other, about half of memcpy bandwidth).
  /// Otherwise ring mode: a ring of `ring_slots` slots of `ring_slot_bytes` that the sender
  /// fills while the receiver drains it; the ring stays in the L3 cache, so the two copies
  /// overlap and cost little more than one (bounded memory whatever the model size).
  std::uint64_t ring_slot_bytes = std::uint64_t{1} << 20;
  std::uint64_t ring_slots = 8;
};

/// How a shared-memory transfer ended, reported by the receiver to the sender.
struct shm_outcome {
  bool committed = false;
  error_code code = error_code::internal; ///< when not committed
  std::string message;                    ///< when not committed
  std::uint64_t version = 0;              ///< the receiver's version afterwards
};

/// The small control path between a shared-memory sender and receiver: descriptors one way,
/// outcomes the other. The weights themselves never travel over it.
class shm_link {
public:
  virtual ~shm_link();
  virtual void post_descriptor(const shm_descriptor& d) = 0;
  /// Throws `error{timeout}` when nothing arrives in time, `error{io_error}` when the peer is
  /// gone, `error{decode_error}` for a malformed message.
  virtual shm_descriptor wait_descriptor(std::chrono::milliseconds timeout) = 0;
  virtual void post_outcome(const shm_outcome& o) = 0;
  /// Throws as `wait_descriptor`.
  virtual shm_outcome wait_outcome(std::chrono::milliseconds timeout) = 0;
  /// True when a message is waiting to be read (does not block).
  virtual bool has_message() = 0;
};

/// Two connected ends of a UNIX-domain socket pair: `first` for the sender, `second` for the
/// receiver. Works between threads and across `fork()` (each process keeps one end and drops
/// the other). Throws `error{io_error}` when the socket pair cannot be made.
std::pair<std::shared_ptr<shm_link>, std::shared_ptr<shm_link>> make_socket_link_pair();

/// The sending end of a link between two processes of one host, over a UNIX-domain socket named
/// `name` in the abstract namespace (nothing is left on disk; `name` is at most 100 bytes and
/// unique per transfer, e.g. chosen by the dispatcher). Listens, then waits up to `timeout` for
/// the receiver (`connect_socket_link`) to connect. Throws `error{invalid_argument}` for a bad
/// name, `error{io_error}` when the socket cannot be bound (e.g. the name is taken) and
/// `error{timeout}` when nobody connects in time.
std::shared_ptr<shm_link> listen_socket_link(const std::string& name,
                                             std::chrono::milliseconds timeout);

/// The receiving end: connects to the socket `listen_socket_link` opened under `name`,
/// retrying until `timeout` (the sender may not be listening yet). Throws as
/// `listen_socket_link`.
std::shared_ptr<shm_link> connect_socket_link(const std::string& name,
                                              std::chrono::milliseconds timeout);

/// Sends weights to an engine process on the same node through POSIX shared memory.
///
/// In both modes the receiver validates the whole manifest before it copies a byte, so a
/// rejected transfer leaves its weights and version untouched. In ring mode the copy then
/// streams: should the sender stop mid-stream (crash, or no progress within the timeout), the
/// receiver's weights are a mix of two versions, so it throws `error{timeout}` and resets its
/// version to 0 ("no coherent version held"); the next complete transfer repairs it.
///
/// The sender owns one segment (`shm_open` + `mmap`), named uniquely per sender and per size
/// ("/rlforge_w_<pid>_<n>_<random>"), reused by later transfers of the same or a smaller size
/// (a fresh segment per transfer would spend more time in page faults than in copying). A
/// transfer writes the header (manifest, version, bucket size) and every bucket into the
/// segment, then hands the descriptor to the receiver and waits for its outcome; the segment is
/// never written while a receiver reads it. The segment is unlinked (`shm_unlink`) when the
/// sender is destroyed, when it grows, and after any failed send; a receiver's existing
/// mapping stays valid after the unlink.
///
/// Thread contract: one thread at a time uses a sender.
class shm_sender final : public weight_sender {
public:
  /// `link` may be null when only `write` is used (the descriptor then travels some other
  /// way). Throws `error{invalid_argument}` for bad options.
  explicit shm_sender(std::shared_ptr<shm_link> link, transport_options opts = {},
                      shm_options shm = {});
  ~shm_sender() override;
  shm_sender(const shm_sender&) = delete;
  shm_sender& operator=(const shm_sender&) = delete;

  /// Writes `weights` as version `version` into the segment in whole-segment mode (whatever
  /// the options say) and returns its descriptor; the data stays valid until the next
  /// `write`/`send` or `release`. Throws `error{io_error}`
  /// naming the segment when shared memory cannot be created or sized.
  shm_descriptor write(const named_tensors& weights, std::uint64_t version);

  /// Posts the transfer's descriptor on the link, writes the data (whole segment or ring, per
  /// the options) and waits (up to the timeout per step) for the receiver's outcome. Throws the receiver's error (e.g. `invalid_argument` for a rejected
  /// manifest), `error{timeout}`, or `error{unsupported}` without a link.
  void send(const named_tensors& weights, std::uint64_t version) override;

  /// Unmaps and unlinks the segment now (the next write makes a new one).
  void release() noexcept;

  /// The current segment's name, empty when there is none.
  const std::string& segment_name() const noexcept;

  const char* kind() const noexcept override { return "shm"; }

private:
  void stream(const named_tensors& weights, std::uint64_t version);

  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Receives weights from an `shm_sender` in another process (or thread) of the same node.
/// It maps the sender's segment (and keeps the mapping for the next transfer of the same
/// segment), validates the header against its tensors, then copies each tensor out of the
/// fully written segment (whole-segment mode: the copy cannot fail half-way) or out of the ring
/// as the sender fills it (ring mode, see `shm_sender`).
///
/// Thread contract: one thread at a time uses a receiver.
class shm_receiver final : public weight_receiver {
public:
  /// `link` may be null when only `apply` is used. Throws `error{invalid_argument}` for bad
  /// options.
  explicit shm_receiver(std::shared_ptr<shm_link> link, transport_options opts = {});
  ~shm_receiver() override;
  shm_receiver(const shm_receiver&) = delete;
  shm_receiver& operator=(const shm_receiver&) = delete;

  /// Validates the transfer `d` describes and commits it into `targets`; returns the version
  /// now held. A ring-mode descriptor needs its sender streaming concurrently. Throws `error{invalid_argument}` for a rejected manifest or a descriptor that
  /// disagrees with its segment, `error{not_found}`/`error{io_error}` naming the segment when
  /// it cannot be opened or mapped, `error{decode_error}` for a malformed header.
  std::uint64_t apply(const shm_descriptor& d, const named_tensors& targets);

  /// Waits on the link for a descriptor, `apply`s it and reports the outcome to the sender.
  std::uint64_t receive(const named_tensors& targets) override;

  const char* kind() const noexcept override { return "shm"; }

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace rlforge::backends
