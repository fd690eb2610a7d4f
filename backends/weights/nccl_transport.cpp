#include "backends/weights/nccl_transport.hpp"

#ifdef RLFORGE_WITH_CUDA

#include "backends/error.hpp"
#include "backends/weights/gloo_transport.hpp"

namespace rlforge::backends {

namespace {

void check_device(c10::Device device, const char* who) {
  if (!device.is_cuda())
    fail(error_code::invalid_argument,
         std::string(who) + ": device must be a CUDA device, got " + device.str());
}

} // namespace

nccl_sender::nccl_sender(collective_group& group, c10::Device device, transport_options opts,
                         int root)
    : group_(group), device_(device), opts_(opts), root_(root) {
  check_device(device, "nccl sender");
  detail::check_collective_endpoint(group, root, true, "nccl", opts, "nccl sender");
}

void nccl_sender::send(const named_tensors& weights, std::uint64_t version) {
  detail::collective_send(group_, root_, device_, opts_.bucket_bytes, bucket_buffer_, weights,
                          version, "nccl sender");
}

nccl_receiver::nccl_receiver(collective_group& group, c10::Device device, transport_options opts,
                             int root)
    : group_(group), device_(device), opts_(opts), root_(root) {
  check_device(device, "nccl receiver");
  detail::check_collective_endpoint(group, root, false, "nccl", opts, "nccl receiver");
}

std::uint64_t nccl_receiver::receive(const named_tensors& targets) {
  return detail::collective_receive(
      group_, root_, device_, buffers_, [&](const weight_manifest&) { return targets; }, version_,
      "nccl receiver");
}

} // namespace rlforge::backends

#endif // RLFORGE_WITH_CUDA
