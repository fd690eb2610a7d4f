#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "backends/collective_group.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

namespace detail {

/// A collective receiver's two buffers of the whole packed layout: `staging` takes the next
/// transfer; `live` is the one the targets view since the last commit, holding version
/// `live_version` (0: none yet). `encoded` holds delta-encoded buckets while they arrive.
struct receive_buffers {
  at::Tensor staging;
  at::Tensor live;
  std::uint64_t live_version = 0;
  at::Tensor encoded;
};

/// A delta-enabled sender's copy of its last transfer: the whole packed layout as sent, with
/// its version (0 while there is none, or while a transfer is under way) and manifest.
struct sent_layout {
  at::Tensor bytes;
  std::uint64_t version = 0;
  weight_manifest manifest;
};

} // namespace detail

/// Makes a receiver's targets once it knows the incoming manifest.
using targets_for_manifest = std::function<named_tensors(const weight_manifest&)>;

/// What one collective transfer sent.
struct transfer_stats {
  bool delta = false;              ///< the buckets went delta-encoded
  std::uint64_t payload_bytes = 0; ///< the weights' bytes (the manifest's total)
  std::uint64_t wire_bytes = 0;    ///< the buckets' bytes broadcast (headers not counted)
  std::uint64_t changed = 0;       ///< delta: the elements whose bits changed
};

/// Sends weights across nodes: packed buckets broadcast from the trainer's rank (`root`,
/// normally 0) of a Gloo `collective_group` whose other ranks are the engines' receivers.
///
/// Protocol (every rank calls in the same order, as the group's ordering contract requires):
/// the root broadcasts the transfer header (manifest, version, bucket size); each receiver
/// validates it against its own tensors; a SUM all-reduce of one flag per rank tells everyone
/// whether any receiver rejected (then every rank throws and nothing is copied); otherwise the
/// root broadcasts each bucket, packed contiguously (a bucket holding one tensor is broadcast
/// straight from that tensor); receivers stage the buckets in one buffer of the layout's size
/// and commit only after the last bucket arrived, by a swap: each target tensor takes its bytes
/// of the staging buffer as its storage (`set_`, no copy; a target that is not contiguous or
/// whose bytes are not aligned to its element is copied into). The buffer the targets viewed
/// before becomes the next transfer's staging buffer, so two buffers alternate and nothing is
/// allocated or copied in the steady state. Hence: after a commit the targets share storage
/// with the receiver, and an alias of a target's former storage (a `detach()` taken before the
/// commit, not a clone) sees the next transfer's bytes arrive. A final barrier returns `send`
/// once every receiver committed. A sender that fails before the header (bad weights)
/// broadcasts an abort with its message instead, so receivers fail with it rather than time
/// out.
///
/// Delta transfers (`set_delta(true)`, CPU only): the sender keeps a copy of what it sent last
/// (one more buffer of the layout's size) and names that version in the header as the delta
/// base. A receiver can take a delta when the version it holds is the base and its targets
/// still view the buffer that transfer committed (nothing replaced or moved them since); each
/// says so in the flag all-reduce. When all can, the sender counts the changed elements of
/// every tensor (weight_delta.hpp), broadcasts the encoded size of each bucket, and sends the
/// buckets encoded when together they are smaller than the layout; each tensor goes as full
/// bytes, changed indices or a bitmap, whichever is smallest. A receiver decodes bucket i into
/// its staging buffer over a copy of its live bytes while bucket i+2 arrives, and commits by
/// the same swap, so the result is bit-identical to a full transfer. Otherwise the transfer is
/// a full one (and refreshes the sender's copy).
///
/// The group is borrowed: it must outlive the sender/receiver, and collectives on it must not
/// interleave with a transfer. Timeouts are the group's (`collective_options::timeout`); after
/// a timeout the group is unusable (see `collective_group`), and a receiver that timed out
/// mid-transfer has not touched its tensors. A peer that dies mid-transfer: a dead receiver
/// fails the send at once (its connection resets); a dead sender fails its receivers at once
/// when they were between two collectives, but receivers whose bucket receives were already
/// posted learn it only from the timeout (Gloo does not fail posted receives when their pair
/// closes). Either way the receivers' tensors and versions are as before the transfer (tested
/// with a SIGKILLed peer process).
class gloo_sender final : public weight_sender {
public:
  /// Throws `error{invalid_argument}` when `group` is not a Gloo group, its rank is not
  /// `root`, or `opts` are bad; `error{out_of_range}` for a root outside the group.
  gloo_sender(collective_group& group, transport_options opts = {}, int root = 0);
  void send(const named_tensors& weights, std::uint64_t version) override;
  const char* kind() const noexcept override { return "gloo"; }

  /// Sets the bucket size of the next transfers (> 0; the header tells the receivers). Throws
  /// `error{invalid_argument}` for 0.
  void set_bucket_bytes(std::uint64_t bytes);
  std::uint64_t bucket_bytes() const noexcept { return opts_.bucket_bytes; }

  /// Turns delta transfers on or off (off by default; see above). Turning it off frees the
  /// copy of the last transfer.
  void set_delta(bool on);
  bool delta() const noexcept { return delta_; }

  /// What the last successful `send` sent (zeros before the first).
  const transfer_stats& last_transfer() const noexcept { return last_; }

private:
  collective_group& group_;
  transport_options opts_;
  int root_;
  at::Tensor bucket_buffer_; // packing space (and encoded buckets), kept between transfers
  bool delta_ = false;
  detail::sent_layout sent_; // delta: the last transfer
  transfer_stats last_;
};

/// The receiving end of `gloo_sender` on one engine rank. See `gloo_sender`.
class gloo_receiver final : public weight_receiver {
public:
  /// Throws `error{invalid_argument}` when `group` is not a Gloo group, its rank is `root`, or
  /// `opts` are bad; `error{out_of_range}` for a root outside the group.
  gloo_receiver(collective_group& group, transport_options opts = {}, int root = 0);
  std::uint64_t receive(const named_tensors& targets) override;
  const char* kind() const noexcept override { return "gloo"; }

  /// `receive` into the tensors `targets_for` returns for the incoming manifest, called once
  /// the header arrived and before the transfer is checked (`check_transfer` then judges what
  /// it returned; an `error` it throws refuses the transfer like a failed check).
  std::uint64_t receive_for(const targets_for_manifest& targets_for);

  /// Declares that the targets changed by other means since the last commit (e.g. written in
  /// place under the same version): the next transfer is refused as a delta and comes whole.
  void forget_base() noexcept { buffers_.live_version = 0; }

private:
  collective_group& group_;
  transport_options opts_;
  int root_;
  detail::receive_buffers buffers_;
};

namespace detail {

/// The collective protocol shared by the Gloo and NCCL transports, on `device`. With `sent`
/// (CPU only), the transfer may go as a delta against it and refreshes it.
transfer_stats collective_send(collective_group& group, int root, c10::Device device,
                               std::uint64_t bucket_bytes, at::Tensor& bucket_buffer,
                               const named_tensors& weights, std::uint64_t version,
                               const char* who, sent_layout* sent = nullptr);

/// Receiving side of `collective_send` into the targets `targets_for` makes for the manifest;
/// updates `version` on commit and returns it.
std::uint64_t collective_receive(collective_group& group, int root, c10::Device device,
                                 receive_buffers& buffers, const targets_for_manifest& targets_for,
                                 std::uint64_t& version, const char* who);

/// Checks a group/root pair for a sender (`sending`) or a receiver.
void check_collective_endpoint(const collective_group& group, int root, bool sending,
                               const char* backend, const transport_options& opts,
                               const char* who);

} // namespace detail

} // namespace rlforge::backends
