#pragma once
// Helpers shared by the benchmarks that time transfers against a memcpy baseline (gloo_bench,
// weight_sync_bench): timing, medians and GB/s, argument parsing and usage errors, and running
// the two sides of a transfer as two threads of this process.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace rlforge::bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// The upper median (the middle element; of an even count, the higher of the two middle ones).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// GB/s (1e9 bytes a second) of moving `bytes` in the median of `seconds`.
inline double gbps(double bytes, const std::vector<double>& seconds) {
  return bytes / median(seconds) / 1e9;
}

/// A whole decimal number in [lo, hi] with nothing after it.
inline bool parse_long(const char* text, long lo, long hi, long& out) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    return false;
  out = v;
  return true;
}

/// Prints "<prog>: <why>" and "usage: <prog> <synopsis>" to stderr; returns 2 (the exit code).
inline int usage_error(const char* prog, const std::string& why, const char* synopsis) {
  std::fprintf(stderr, "%s: %s\nusage: %s %s\n", prog, why.c_str(), prog, synopsis);
  return 2;
}

/// Runs `peer` on a second thread while `main` runs on this one, and waits for both. If either
/// throws, prints "<prog>: <main_name or peer_name>: <what>" to stderr (`main`'s error first)
/// and returns false.
inline bool run_with_peer_thread(const char* prog, const char* main_name,
                                 const std::function<void()>& main, const char* peer_name,
                                 const std::function<void()>& peer) {
  std::string peer_error;
  std::thread thread([&] {
    try {
      peer();
    } catch (const std::exception& e) {
      peer_error = e.what();
    }
  });
  try {
    main();
  } catch (const std::exception& e) {
    thread.join();
    std::fprintf(stderr, "%s: %s: %s\n", prog, main_name, e.what());
    return false;
  }
  thread.join();
  if (!peer_error.empty()) {
    std::fprintf(stderr, "%s: %s: %s\n", prog, peer_name, peer_error.c_str());
    return false;
  }
  return true;
}

} // namespace rlforge::bench
