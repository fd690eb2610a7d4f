#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backends/weights/shm_transport.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

/// Weight sync between two processes on the same CUDA device (SkyRL's colocated path): the
/// sender exports CUDA IPC handles of the memory its tensors already live in and the receiver
/// copies straight from there into its own tensors, one device-to-device copy per tensor and no
/// staging buffer. The handles, offsets and the transfer header travel on an `shm_link`
/// (`shm_descriptor::cuda_ipc`); the outcome comes back on it.
///
/// The receiver validates the whole manifest (`check_transfer`) and opens every handle before it
/// writes a byte, so a rejected transfer, or handles it cannot open, leave its weights and
/// version untouched. The sender's tensors must be allocated by libtorch's CUDA caching
/// allocator (ordinary CUDA tensors) on the sender's device, and must not change until `send`
/// returns. CUDA IPC works between processes only (a process cannot open its own handles);
/// threads of one process use `in_process_sender`.
///
/// In a build without CUDA (RLFORGE_CUDA=OFF) the constructors throw `error{unsupported}`.
/// Thread contract: one thread at a time uses a sender or a receiver; it binds itself to the
/// object's device while it works.
class cuda_ipc_sender final : public weight_sender {
public:
  /// Sends from tensors on `device` (a CUDA device). Throws `error{invalid_argument}` for a
  /// null link, a CPU device or bad options, `error{unsupported}` in a CPU build.
  cuda_ipc_sender(std::shared_ptr<shm_link> link, c10::Device device,
                  transport_options opts = {});

  /// Waits for the queued work on the device (the tensors must be final), posts the handles
  /// and waits up to the timeout for the receiver's outcome. Throws the receiver's error (e.g.
  /// `invalid_argument` for a rejected manifest), `error{timeout}`, `error{invalid_argument}`
  /// for a tensor on another device, `error{backend_error}` when a handle cannot be exported.
  void send(const named_tensors& weights, std::uint64_t version) override;

  const char* kind() const noexcept override { return "cuda_ipc"; }

private:
  std::shared_ptr<shm_link> link_;
  c10::Device device_;
  transport_options opts_;
};

/// The receiving end of `cuda_ipc_sender`, in another process on the same device. Opened
/// handles are kept while the sender keeps using the same memory (a trainer's weights stay
/// where they are between syncs) and closed when a transfer no longer names them, or with the
/// receiver.
class cuda_ipc_receiver final : public weight_receiver {
public:
  /// Receives into tensors on `device` (a CUDA device). Throws as `cuda_ipc_sender`'s
  /// constructor.
  cuda_ipc_receiver(std::shared_ptr<shm_link> link, c10::Device device,
                    transport_options opts = {});
  ~cuda_ipc_receiver() override;
  cuda_ipc_receiver(const cuda_ipc_receiver&) = delete;
  cuda_ipc_receiver& operator=(const cuda_ipc_receiver&) = delete;

  /// Waits up to the timeout for a descriptor, checks it, opens its handles, copies every
  /// tensor and reports the outcome to the sender. Throws `error{invalid_argument}` for a
  /// rejected manifest or a descriptor that is not a CUDA IPC one, `error{backend_error}` when
  /// a handle cannot be opened or a copy fails, `error{timeout}` / `error{io_error}` from the
  /// link.
  std::uint64_t receive(const named_tensors& targets) override;

  const char* kind() const noexcept override { return "cuda_ipc"; }

private:
  void close_unused(const std::map<std::string, void*>& keep) noexcept;

  std::shared_ptr<shm_link> link_;
  c10::Device device_;
  transport_options opts_;
  std::map<std::string, void*> opened_; ///< handle (hex) -> this process's mapping
};

} // namespace rlforge::backends
