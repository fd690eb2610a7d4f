// The receiving process of cuda_ipc_test.cpp: `cuda_ipc_peer LINK` connects to the test's
// link, receives versions 1 and 2 into its own tensors on cuda:0 and checks them bit for bit
// against `ipc_weights`, then expects version 3 (sent with a wrong shape) to be refused with its
// weights and version unchanged. Prints "peer: ok" and exits 0, or says what failed and exits 1.
#include <chrono>
#include <cstdio>
#include <string>

#include <ATen/ATen.h>

#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "backends/weights/cuda_ipc_transport.hpp"
#include "backends/weights/shm_transport.hpp"
#include "tests/gpu/ipc_weights.hpp"

namespace be = rlforge::backends;

namespace {

bool holds(const be::named_tensors& targets, uint64_t version) {
  auto want = rlforge::gpu_test::ipc_weights(version);
  for (size_t i = 0; i < want.size(); ++i)
    if (!at::equal(targets[i].second.cpu(), want[i].second)) {
      std::printf("peer: tensor '%s' differs from version %llu\n", want[i].first.c_str(),
                  static_cast<unsigned long long>(version));
      return false;
    }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("usage: cuda_ipc_peer LINK\n");
    return 2;
  }
  try {
    const c10::Device dev(c10::kCUDA, 0);
    be::bind_thread_to(dev);
    be::named_tensors targets;
    for (const auto& s : rlforge::gpu_test::ipc_shapes())
      targets.emplace_back(s.name, at::zeros(s.shape, at::TensorOptions().dtype(s.dtype).device(dev)));
    auto link = be::connect_socket_link(argv[1], std::chrono::seconds(60));
    be::transport_options opts;
    opts.timeout = std::chrono::seconds(60);
    be::cuda_ipc_receiver receiver(link, dev, opts);
    for (uint64_t v : {1, 2}) {
      if (receiver.receive(targets) != v || !holds(targets, v)) {
        std::printf("peer: version %llu not received as sent\n",
                    static_cast<unsigned long long>(v));
        return 1;
      }
    }
    try {
      receiver.receive(targets);
      std::printf("peer: version 3 (a wrong shape) was accepted\n");
      return 1;
    } catch (const be::error& e) {
      if (e.code() != be::error_code::invalid_argument ||
          std::string(e.what()).find("shape") == std::string::npos) {
        std::printf("peer: version 3 refused for another reason: %s\n", e.what());
        return 1;
      }
    }
    if (receiver.version() != 2 || !holds(targets, 2)) {
      std::printf("peer: the refused version changed the weights\n");
      return 1;
    }
    std::printf("peer: ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("peer: %s\n", e.what());
    return 1;
  }
}
