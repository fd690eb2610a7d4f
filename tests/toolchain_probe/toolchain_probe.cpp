// Checks that the libraries of the GPU subset work together on this machine (see CMakeLists.txt):
// a CAF actor runs a libtorch product (on the GPU where there is one), spdlog logs it, msgpack
// and nlohmann-json round-trip a value, a one-rank c10d Gloo group (and NCCL group in a CUDA
// build) all-reduces, GoogleTest's library links. Prints one "probe: ..." line per check and
// "probe: ok" at the end; exits 1 at the first failure.
#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#ifdef RLFORGE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::printf("probe: FAILED: %s\n", what.c_str());
  std::exit(1);
}

at::Device compute_device() {
#ifdef RLFORGE_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
    return at::Device(at::kCUDA, 0);
#endif
  return at::Device(at::kCPU);
}

/// One-rank all-reduce of ones through `pg`: the sum is the input.
template <class Group>
void allreduce_one_rank(Group& pg, at::Device device, const char* name) {
  std::vector<at::Tensor> ts{at::ones({1024}, at::TensorOptions().device(device))};
  pg.allreduce(ts)->wait();
  if (ts[0].sum().item<double>() != 1024)
    die(std::string(name) + " all-reduce gave the wrong sum");
  std::printf("probe: c10d %s world 1 all-reduce ok on %s\n", name, device.str().c_str());
}

} // namespace

int main() {
  std::printf("probe: libtorch %s, CAF %d, C++ ABI %d\n", TORCH_VERSION, CAF_VERSION,
              _GLIBCXX_USE_CXX11_ABI);
  const auto device = compute_device();

  // CAF: an actor computes; the caller waits for the answer.
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto worker = sys.spawn([device]() -> caf::behavior {
    return {[device](int64_t n) {
      auto a = at::ones({n, n}, at::TensorOptions().device(device).dtype(at::kBFloat16));
      return at::mm(a, a).sum().item<double>();
    }};
  });
  double result = 0;
  caf::scoped_actor self{sys};
  self->request(worker, std::chrono::seconds(60), int64_t{64})
      .receive([&](double x) { result = x; },
               [&](caf::error& e) { die("CAF request: " + caf::to_string(e)); });
  if (result != 64.0 * 64 * 64)
    die("the actor's bf16 product gave " + std::to_string(result));
  spdlog::info("probe: a CAF actor computed a bf16 product on {}", device.str());
  std::printf("probe: CAF actor + libtorch ok on %s\n", device.str().c_str());

  // msgpack and nlohmann-json.
  msgpack::sbuffer buf;
  msgpack::pack(buf, std::vector<int64_t>{1, 2, 3});
  auto back = msgpack::unpack(buf.data(), buf.size()).get().as<std::vector<int64_t>>();
  auto j = nlohmann::json::parse(nlohmann::json{{"x", back}}.dump());
  if (j["x"].get<std::vector<int64_t>>() != std::vector<int64_t>{1, 2, 3})
    die("msgpack / json round trip");
  std::printf("probe: msgpack + nlohmann-json ok\n");

  // c10d Gloo, world size 1 (the gloo headers must fit the gloo compiled into libtorch).
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto gopts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(30000));
  gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, gopts);
  allreduce_one_rank(*gloo, at::kCPU, "gloo");

#ifdef RLFORGE_WITH_CUDA
  if (device.is_cuda()) {
    auto nstore = c10::make_intrusive<c10d::HashStore>();
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nstore, 0, 1, nopts);
    allreduce_one_rank(*nccl, device, "nccl");
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    std::printf("probe: cudaMemGetInfo free %.1f GiB of %.1f GiB; caching allocator holds %lld "
                "bytes reserved\n",
                free_bytes / 1073741824.0, total_bytes / 1073741824.0,
                static_cast<long long>(stats.reserved_bytes[0].current));
  }
#endif

  // GoogleTest's library links and runs its own code.
  testing::InitGoogleTest();
  std::printf("probe: ok\n");
  return 0;
}
