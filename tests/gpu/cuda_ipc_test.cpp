// Weight sync by CUDA IPC between two processes on one GPU (backends/weights/
// cuda_ipc_transport.hpp): this process sends from its device tensors, cuda_ipc_peer receives
// into its own and checks every byte; new memory on the second transfer (new handles); a
// rejected manifest leaves the peer's weights and version as they were; bad endpoints refused.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <unistd.h>

#include "backends/error.hpp"
#include "backends/weights/cuda_ipc_transport.hpp"
#include "backends/weights/shm_transport.hpp"
#include "gpu_support.hpp"
#include "tests/cluster/process.hpp"
#include "tests/gpu/ipc_weights.hpp"

using namespace rlforge;
namespace be = rlforge::backends;
using namespace std::chrono_literals;

namespace {

be::named_tensors on_device(be::named_tensors ts) {
  for (auto& [name, t] : ts)
    t = t.to(gpu_test::cuda0());
  return ts;
}

} // namespace

TEST(GpuIpc, WeightsReachAnotherProcessOnTheSameDevice) {
  RLFORGE_REQUIRE_CUDA();
  const std::string link_name = "rlforge-ipc-test-" + std::to_string(::getpid());
  cluster_test::child_process peer({RLFORGE_CUDA_IPC_PEER, link_name},
                                   testing::TempDir() + "/cuda_ipc_peer.log");
  be::transport_options opts;
  opts.timeout = 60s;
  auto link = be::listen_socket_link(link_name, 60s);
  be::cuda_ipc_sender sender(link, gpu_test::cuda0(), opts);
  auto v1 = on_device(gpu_test::ipc_weights(1));
  sender.send(v1, 1);
  auto v2 = on_device(gpu_test::ipc_weights(2)); // other memory: other handles
  sender.send(v2, 2);
  auto v3 = on_device(gpu_test::ipc_weights(3));
  v3[1].second = v3[1].second.narrow(0, 0, 128).contiguous(); // a shape the peer does not have
  try {
    sender.send(v3, 3);
    ADD_FAILURE() << "the peer took a wrong shape";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("layer.0.q"), std::string::npos) << e.what();
  }
  auto code = peer.wait_exit(60s);
  ASSERT_TRUE(code.has_value()) << "the peer did not finish: " << peer.log();
  EXPECT_EQ(*code, 0) << peer.log();
  EXPECT_NE(peer.log().find("peer: ok"), std::string::npos) << peer.log();
}

TEST(GpuIpc, BadEndpointsAreRefused) {
  // In every build: a CPU device, or a CPU build, is refused at construction.
  auto links = be::make_socket_link_pair();
  try {
    be::cuda_ipc_sender s(links.first, c10::Device(c10::kCPU));
    ADD_FAILURE() << "a CUDA IPC sender on the CPU";
  } catch (const be::error& e) {
    EXPECT_TRUE(e.code() == be::error_code::invalid_argument ||
                e.code() == be::error_code::unsupported)
        << e.what();
  }
  if (!be::built_with_cuda())
    return;
  try {
    be::cuda_ipc_receiver r(nullptr, gpu_test::cuda0());
    ADD_FAILURE() << "a receiver without a link";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("link is null"), std::string::npos) << e.what();
  }
}
