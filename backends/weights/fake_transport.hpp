#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/weights/in_process_transport.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

/// A scriptable transport for tests of the layers above (actors, dispatcher): in-process
/// semantics (the sender blocks until the receiver committed or rejected), plus a history of
/// every transfer and injected failures on either end. Shared by both ends through a
/// `std::shared_ptr`; every member is safe to call from any thread.
class fake_channel {
public:
  /// Throws `error{invalid_argument}` for bad options.
  explicit fake_channel(transport_options opts = {});
  ~fake_channel();
  fake_channel(const fake_channel&) = delete;
  fake_channel& operator=(const fake_channel&) = delete;

  /// The next `send` throws `error{code, message}` at once, before anything reaches the
  /// receiver (which keeps waiting).
  void fail_next_send(error_code code, std::string message);

  /// The next `receive` takes the transfer and rejects it with `error{code, message}`: the
  /// receiver's weights and version stay unchanged and its sender throws the same code.
  void fail_next_receive(error_code code, std::string message);

  /// One transfer as the sender saw it.
  struct record {
    std::uint64_t version = 0;
    weight_manifest manifest;
    bool committed = false;
    std::string message; ///< the failure, when not committed
  };

  /// Every `send` so far, in order (failed ones included).
  std::vector<record> history() const;

  /// The channel both ends use underneath.
  in_process_channel& channel();

private:
  friend class fake_sender;
  friend class fake_receiver;
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The sending end of a `fake_channel`. See `weight_sender`.
class fake_sender final : public weight_sender {
public:
  explicit fake_sender(std::shared_ptr<fake_channel> channel);
  void send(const named_tensors& weights, std::uint64_t version) override;
  const char* kind() const noexcept override { return "fake"; }

private:
  std::shared_ptr<fake_channel> channel_;
};

/// The receiving end of a `fake_channel`. See `weight_receiver`.
class fake_receiver final : public weight_receiver {
public:
  explicit fake_receiver(std::shared_ptr<fake_channel> channel);
  std::uint64_t receive(const named_tensors& targets) override;
  const char* kind() const noexcept override { return "fake"; }

private:
  std::shared_ptr<fake_channel> channel_;
};

} // namespace rlforge::backends
