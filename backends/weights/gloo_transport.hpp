#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "backends/collective_group.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

namespace detail {

/// A collective receiver's two buffers of the whole packed layout: `staging` takes the next
/// transfer; `live` is the one the targets view since the last commit.
struct receive_buffers {
  at::Tensor staging;
  at::Tensor live;
};

} // namespace detail

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
/// once every receiver committed. A sender that fails before
/// the header (bad weights) broadcasts an abort with its message instead, so receivers fail
/// with it rather than time out.
///
/// The group is borrowed: it must outlive the sender/receiver, and collectives on it must not
/// interleave with a transfer. Timeouts are the group's (`collective_options::timeout`); after
/// a timeout the group is unusable (see `collective_group`), and a receiver that timed out
/// mid-transfer has not touched its tensors.
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

private:
  collective_group& group_;
  transport_options opts_;
  int root_;
  at::Tensor bucket_buffer_; // packing space for multi-tensor buckets, kept between transfers
};

/// The receiving end of `gloo_sender` on one engine rank. See `gloo_sender`.
class gloo_receiver final : public weight_receiver {
public:
  /// Throws `error{invalid_argument}` when `group` is not a Gloo group, its rank is `root`, or
  /// `opts` are bad; `error{out_of_range}` for a root outside the group.
  gloo_receiver(collective_group& group, transport_options opts = {}, int root = 0);
  std::uint64_t receive(const named_tensors& targets) override;
  const char* kind() const noexcept override { return "gloo"; }

private:
  collective_group& group_;
  transport_options opts_;
  int root_;
  detail::receive_buffers buffers_;
};

namespace detail {

/// The collective protocol shared by the Gloo and NCCL transports, on `device`.
void collective_send(collective_group& group, int root, c10::Device device,
                     std::uint64_t bucket_bytes, at::Tensor& bucket_buffer,
                     const named_tensors& weights, std::uint64_t version, const char* who);

/// Receiving side of `collective_send`; updates `version` on commit and returns it.
std::uint64_t collective_receive(collective_group& group, int root, c10::Device device,
                                 receive_buffers& buffers, const named_tensors& targets,
                                 std::uint64_t& version, const char* who);

/// Checks a group/root pair for a sender (`sending`) or a receiver.
void check_collective_endpoint(const collective_group& group, int root, bool sending,
                               const char* backend, const transport_options& opts,
                               const char* who);

} // namespace detail

} // namespace rlforge::backends
