#include "backends/model/compute_dtype.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "backends/devices.hpp"
#include "backends/error.hpp"

namespace rlforge::backends {

const char* to_string(compute_dtype x) noexcept {
  return x == compute_dtype::bf16 ? "bf16" : "fp32";
}

compute_dtype parse_compute_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32")
    return compute_dtype::fp32;
  if (name == "bf16" || name == "bfloat16")
    return compute_dtype::bf16;
  fail(error_code::invalid_argument,
       "compute dtype must be fp32 or bf16, got '" + std::string(name) + "'");
}

c10::ScalarType gemm_scalar_type(compute_dtype x) noexcept {
  return x == compute_dtype::bf16 ? c10::ScalarType::BFloat16 : c10::ScalarType::Float;
}

namespace {

/// The CPU feature flags of /proc/cpuinfo's first "flags" line, space-separated ("" when the
/// file cannot be read).
std::string cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? "" : " " + line.substr(colon + 1) + " ";
    }
  return "";
}

bf16_support detect() {
  bf16_support s;
  if (cuda_device_count() > 0) {
    // Every CUDA device torch supports here computes bf16 GEMMs on tensor cores (sm_80+); older
    // ones are rejected by the CUDA 13 toolkit this build targets.
    s.fast = true;
    s.reason = "CUDA device";
    return s;
  }
  auto flags = cpu_flags();
  for (const char* f : {"amx_bf16", "avx512_bf16"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) {
      s.fast = true;
      s.reason = std::string("CPU has ") + f;
      return s;
    }
  s.reason = flags.empty() ? "no /proc/cpuinfo flags" : "CPU has neither avx512_bf16 nor amx_bf16";
  return s;
}

} // namespace

const bf16_support& detect_bf16_support() {
  static const bf16_support s = detect();
  return s;
}

std::optional<compute_dtype> compute_dtype_from_environment() {
  const char* forced = std::getenv("RLFORGE_COMPUTE_DTYPE");
  if (forced == nullptr || *forced == '\0')
    return std::nullopt;
  try {
    return parse_compute_dtype(forced);
  } catch (const error& e) {
    fail(error_code::invalid_argument, std::string("RLFORGE_COMPUTE_DTYPE: ") + e.what());
  }
}

compute_dtype default_compute_dtype() {
  if (auto forced = compute_dtype_from_environment())
    return *forced;
  return detect_bf16_support().fast ? compute_dtype::bf16 : compute_dtype::fp32;
}

} // namespace rlforge::backends
