#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/error.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

/// The meeting point of an in-process sender and receiver (threads of one process, e.g. a
/// trainer actor and an engine actor colocated in one node process). Shared by both ends
/// through a `std::shared_ptr`; safe to use from both threads at once.
///
/// Protocol: the sender posts a transfer and blocks; the receiver takes it, validates it
/// against its tensors and then copies, bucket by bucket, straight from the sender's tensors
/// into its own (memcpy, no staging buffer), and reports the outcome, which releases the
/// sender. Validation is complete before the first byte is copied and the copy itself cannot
/// fail, so a transfer is either committed whole or not at all.
class in_process_channel {
public:
  /// Throws `error{invalid_argument}` for bad options (`bucket_bytes` 0, timeout <= 0).
  explicit in_process_channel(transport_options opts = {});
  ~in_process_channel();
  in_process_channel(const in_process_channel&) = delete;
  in_process_channel& operator=(const in_process_channel&) = delete;

  const transport_options& options() const noexcept;

  /// A posted transfer, as the receiver sees it.
  struct transfer {
    weight_manifest manifest;
    named_tensors sources; ///< contiguous, in manifest order, alive until the outcome is set
    std::uint64_t version = 0;
  };

  /// How a transfer ended, as the sender sees it.
  struct outcome {
    bool committed = false;
    error_code code = error_code::internal; ///< when not committed
    std::string message;                    ///< when not committed
    std::uint64_t version = 0;              ///< the receiver's version afterwards
  };

  /// Sender side: posts `t`, waits (up to the timeout) for a receiver to take it, then until it
  /// reports the outcome. Throws `error{timeout}` (and withdraws `t`) when nobody takes it in
  /// time. Only one transfer is in flight at a time: a second sender waits its turn.
  outcome post_and_wait(transfer t);

  /// Receiver side: waits up to the timeout for a posted transfer and returns it. The sender
  /// stays blocked until `complete` is called. Throws `error{timeout}` when nothing arrives.
  const transfer& take();

  /// Receiver side: ends the transfer returned by `take` and releases its sender.
  void complete(outcome o);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The channel registered under `name` in this process, created with `opts` when no live channel
/// has that name. Channels are held by their users: the registry keeps only weak references, so
/// a channel disappears when the last sender and receiver holding it are gone. This is how a
/// trainer actor and an engine actor of one process, told the same name by the dispatcher,
/// meet. Thread-safe. Throws `error{invalid_argument}` for an empty name or bad options.
std::shared_ptr<in_process_channel> named_in_process_channel(const std::string& name,
                                                             transport_options opts = {});

/// Sends through an `in_process_channel`. See `weight_sender`.
class in_process_sender final : public weight_sender {
public:
  explicit in_process_sender(std::shared_ptr<in_process_channel> channel);
  void send(const named_tensors& weights, std::uint64_t version) override;
  const char* kind() const noexcept override { return "in_process"; }

private:
  std::shared_ptr<in_process_channel> channel_;
};

/// Receives through an `in_process_channel`. See `weight_receiver`.
class in_process_receiver final : public weight_receiver {
public:
  explicit in_process_receiver(std::shared_ptr<in_process_channel> channel);
  std::uint64_t receive(const named_tensors& targets) override;
  const char* kind() const noexcept override { return "in_process"; }

private:
  std::shared_ptr<in_process_channel> channel_;
};

namespace detail {

/// Throws the error a rejected/failed `outcome` describes, prefixed with `who`.
[[noreturn]] void throw_outcome(const in_process_channel::outcome& o, const char* who);

/// Copies `t.sources` into `targets` bucket by bucket (memcpy per tensor); `check_transfer`
/// must have accepted the transfer.
void copy_transfer(const in_process_channel::transfer& t, const named_tensors& targets,
                   std::uint64_t bucket_bytes);

} // namespace detail

} // namespace rlforge::backends
