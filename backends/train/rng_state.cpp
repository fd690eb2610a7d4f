#include "backends/train/rng_state.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <mutex>

namespace rlforge::backends {

rng_state capture_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  at::Tensor bytes;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    bytes = gen.get_state();
  }
  bytes = bytes.contiguous();
  rng_state s;
  s.torch_cpu.resize(static_cast<size_t>(bytes.numel()));
  if (!s.torch_cpu.empty())
    std::memcpy(s.torch_cpu.data(), bytes.data_ptr<uint8_t>(), s.torch_cpu.size());
  return s;
}

void restore_rng_state(const rng_state& s) {
  if (s.torch_cpu.empty())
    fail(error_code::invalid_argument, "rng_state: no torch CPU generator state to restore");
  auto bytes = at::empty({static_cast<int64_t>(s.torch_cpu.size())}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), s.torch_cpu.data(), s.torch_cpu.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(bytes);
  } catch (const c10::Error& e) {
    fail(error_code::invalid_argument, "rng_state: torch refused the CPU generator state (" +
                                           std::to_string(s.torch_cpu.size()) +
                                           " bytes): " + e.what_without_backtrace());
  }
}

} // namespace rlforge::backends
