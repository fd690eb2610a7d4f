/// Helpers of the GPU benches (bench/gpu): their flags, the median of timed runs with the device
/// synchronised around each, a bf16 GEMM reference, and one JSON object per figure on stdout
/// (bench/gpu/run gathers them next to the PyTorch peers'). Header-only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/devices.hpp"
#include "bench/bench_util.hpp"

namespace rlforge::gpu_bench {

using bench::median;

/// The flags of a bench, one at a time: `while (f.next())` then `f.is("--x")`, `f.value()`,
/// `f.integer()`; an unknown flag or a missing value prints `usage` and exits 2.
class flags {
public:
  flags(int argc, char** argv, std::string usage) : argc_(argc), argv_(argv), usage_(std::move(usage)) {}

  bool next() {
    if (++i_ >= argc_)
      return false;
    flag_ = argv_[i_];
    return true;
  }
  bool is(const char* name) const { return flag_ == name; }
  std::string value() {
    if (i_ + 1 >= argc_)
      fail(flag_ + " needs a value");
    return argv_[++i_];
  }
  long long integer() { return std::atoll(value().c_str()); }
  [[noreturn]] void unknown() const { fail("unknown flag '" + flag_ + "'"); }
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\nusage: %s\n", argv_[0], why.c_str(), usage_.c_str());
    std::exit(2);
  }

private:
  int argc_;
  char** argv_;
  std::string usage_;
  int i_ = 0;
  std::string flag_;
};

/// Median seconds of `reps` runs of `f` after `warmup` untimed ones, the device synchronised
/// before and after each.
template <class F>
double timed(const c10::Device& device, int reps, int warmup, F&& f) {
  for (int i = 0; i < warmup; ++i)
    f();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    backends::synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    f();
    backends::synchronize(device);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(times);
}

/// TFLOP/s of an n^3 product in `dtype` on `device` (median of 10 after 3 warm-ups): the
/// denominator of the MFU the benches print.
inline double gemm_tflops(const c10::Device& device, int64_t n, at::ScalarType dtype) {
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  auto a = at::randn({n, n}, on), b = at::randn({n, n}, on), c = at::mm(a, b);
  const double s = timed(device, 10, 3, [&] { at::mm_out(c, a, b); });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s / 1e12;
}

inline void emit(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

/// "cuda" (cuda:0) or "cpu" from a --device value; exits with a message for anything else.
inline c10::Device parse_device(const std::string& name) {
  if (name == "cuda")
    return c10::Device(c10::kCUDA, 0);
  if (name == "cpu")
    return c10::Device(c10::kCPU);
  std::fprintf(stderr, "--device takes cuda or cpu, got '%s'\n", name.c_str());
  std::exit(2);
}

} // namespace rlforge::gpu_bench
