#pragma once

#ifdef RLFORGE_WITH_CUDA

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "backends/collective_group.hpp"
#include "backends/weights/gloo_transport.hpp"
#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {

/// The Gloo transport's protocol (see `gloo_sender`) over an NCCL `collective_group`: weights,
/// bucket buffers and the receivers' two staging buffers live on the group's CUDA device. Only in
/// builds with RLFORGE_WITH_CUDA.
class nccl_sender final : public weight_sender {
public:
  /// `device` is this rank's CUDA device (the weights must be on it). Throws
  /// `error{invalid_argument}` for a non-NCCL group, a non-CUDA device, a rank that is not
  /// `root` or bad options.
  nccl_sender(collective_group& group, c10::Device device, transport_options opts = {},
              int root = 0);
  void send(const named_tensors& weights, std::uint64_t version) override;
  const char* kind() const noexcept override { return "nccl"; }

private:
  collective_group& group_;
  c10::Device device_;
  transport_options opts_;
  int root_;
  at::Tensor bucket_buffer_;
};

/// The receiving end of `nccl_sender`; its targets must be on `device`.
class nccl_receiver final : public weight_receiver {
public:
  nccl_receiver(collective_group& group, c10::Device device, transport_options opts = {},
                int root = 0);
  std::uint64_t receive(const named_tensors& targets) override;
  const char* kind() const noexcept override { return "nccl"; }

private:
  collective_group& group_;
  c10::Device device_;
  transport_options opts_;
  int root_;
  detail::receive_buffers buffers_;
};

} // namespace rlforge::backends

#endif // RLFORGE_WITH_CUDA
