// Weight sync between two processes on one device, against the device's own copy rate: this
// program sends the weights of a model shape (bf16 for the GEMM weights, as a bf16 trainer
// sends them to bf16 engines) to a copy of itself started with --receive, `--reps` times,
// through CUDA IPC (one device-to-device copy per tensor from the sender's memory) or, for a
// CPU rehearsal, shared memory. Prints the median transfer time and GB/s, the device-to-device
// (or memcpy) rate of the same bytes in this process, and their ratio (figure "weight_sync").
// NCCL is not measured: one GPU takes one NCCL rank, so a broadcast has nobody to reach.
//
//   gpu_weight_sync_bench [--device cuda|cpu] [--preset qwen2.5-0.5b] [--reps 5]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backends/devices.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/hf_checkpoint.hpp"
#include "backends/model/model_config.hpp"
#include "backends/weights/cuda_ipc_transport.hpp"
#include "backends/weights/shm_transport.hpp"
#include "bench/gpu/bench_json.hpp"

namespace be = rlforge::backends;
namespace gb = rlforge::gpu_bench;
using namespace std::chrono_literals;

namespace {

be::named_tensors model_weights(const be::model_config& c, const c10::Device& device) {
  be::named_tensors out;
  for (const auto& [name, shape] : be::expected_weight_shapes(c)) {
    auto dtype = be::causal_lm::is_gemm_weight(name) ? at::kBFloat16 : at::kFloat;
    out.emplace_back(name, at::empty(shape, at::TensorOptions().dtype(dtype).device(device)));
  }
  return out;
}

std::unique_ptr<be::weight_receiver> receiver_for(std::shared_ptr<be::shm_link> link,
                                                   const c10::Device& device,
                                                   const be::transport_options& opts) {
  if (device.is_cuda())
    return std::make_unique<be::cuda_ipc_receiver>(std::move(link), device, opts);
  return std::make_unique<be::shm_receiver>(std::move(link), opts);
}

} // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda", preset = "qwen2.5-0.5b", receive;
  int reps = 5;
  gb::flags f(argc, argv,
              "gpu_weight_sync_bench [--device cuda|cpu] [--preset NAME] [--reps R]");
  while (f.next()) {
    if (f.is("--device")) device_name = f.value();
    else if (f.is("--preset")) preset = f.value();
    else if (f.is("--reps")) reps = static_cast<int>(f.integer());
    else if (f.is("--receive")) receive = f.value();
    else f.unknown();
  }
  if (reps < 1) {
    std::fprintf(stderr, "gpu_weight_sync_bench: --reps must be >= 1\n");
    return 2;
  }
  const auto device = gb::parse_device(device_name);
  be::bind_thread_to(device);
  const auto config = be::preset(preset);
  be::transport_options opts;
  opts.timeout = 120s;
  if (!receive.empty()) { // the receiving process
    auto targets = model_weights(config, device);
    auto r = receiver_for(be::connect_socket_link(receive, 60s), device, opts);
    for (int k = 0; k <= reps; ++k)
      r->receive(targets);
    return 0;
  }
  const std::string link_name = "rlforge-sync-bench-" + std::to_string(::getpid());
  pid_t child = ::fork();
  if (child == 0) {
    ::execl("/proc/self/exe", "gpu_weight_sync_bench", "--device", device_name.c_str(),
            "--preset", preset.c_str(), "--reps", std::to_string(reps).c_str(), "--receive",
            link_name.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  auto weights = model_weights(config, device);
  for (auto& [name, t] : weights)
    t.uniform_(-1, 1);
  double bytes = 0;
  for (auto& [name, t] : weights)
    bytes += static_cast<double>(t.nbytes());
  auto link = be::listen_socket_link(link_name, 60s);
  std::unique_ptr<be::weight_sender> sender;
  if (device.is_cuda())
    sender = std::make_unique<be::cuda_ipc_sender>(link, device, opts);
  else
    sender = std::make_unique<be::shm_sender>(link, opts);
  uint64_t version = 0;
  const double seconds = gb::timed(device, reps, 1, [&] { sender->send(weights, ++version); });
  int status = 0;
  ::waitpid(child, &status, 0);
  // The same bytes copied tensor by tensor within this process: the limit a transfer meets.
  auto copies = model_weights(config, device);
  const double copy_s = gb::timed(device, reps, 1, [&] {
    for (size_t i = 0; i < weights.size(); ++i)
      copies[i].second.copy_(weights[i].second);
  });
  gb::emit({{"figure", "weight_sync"},
            {"impl", "rlforge"},
            {"transport", sender->kind()},
            {"device", be::describe(device)},
            {"preset", preset},
            {"bytes", bytes},
            {"seconds", seconds},
            {"gbps", bytes / seconds / 1e9},
            {"copy_gbps", bytes / copy_s / 1e9},
            {"ratio_to_copy", copy_s / seconds},
            {"receiver_exit", WIFEXITED(status) ? WEXITSTATUS(status) : -1}});
  gb::emit({{"figure", "weight_sync"},
            {"impl", "rlforge"},
            {"transport", "nccl"},
            {"measured", false},
            {"why", "one GPU takes one NCCL rank: a broadcast has no peer to reach"}});
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
