// fp32 GEMM throughput of the BLAS libtorch loaded, at 1 thread and at every core, for a few
// sizes. The peer is the same product on 1 thread, measured in the same run: the ratio is the
// parallel speed-up (ideal = thread count).
//
//   gemm_bench [--reps N]
#include "backends/blas_info.hpp"
#include "backends/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  using namespace rlforge::backends;
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--reps" && i + 1 < argc) {
      char* end = nullptr;
      errno = 0;
      long v = std::strtol(argv[++i], &end, 10);
      if (errno != 0 || *end != '\0' || v < 1 || v > 1000) {
        std::fprintf(stderr, "gemm_bench: --reps must be in [1, 1000], got '%s'\n", argv[i]);
        return 2;
      }
      reps = int(v);
    } else {
      std::fprintf(stderr, "gemm_bench: unknown argument '%s'\nusage: gemm_bench [--reps N]\n",
                   flag.c_str());
      return 2;
    }
  }
  try {
    auto r = inspect_blas();
    std::printf("# blas: %s (%s); torch %s, %s\n", r.library.c_str(), r.path.c_str(),
                r.torch_version.c_str(), r.parallel_backend.c_str());
    auto w = blas_warning(r);
    if (!w.empty())
      std::printf("%s\n", w.c_str());
    int cores = std::max(1, int(std::thread::hardware_concurrency()));
    for (int n : {256, 512, 1024, 2048}) {
      // Fewer repetitions for the big product keep the run short on a slow BLAS.
      int k = n >= 2048 ? std::max(3, reps / 3) : reps;
      auto one = measure_gemm_gflops(n, 1, k);
      auto all = measure_gemm_gflops(n, cores, k);
      std::printf("gemm.fp32 %4dx%-4d: 1 thread %7.1f GFLOP/s | %d threads %7.1f GFLOP/s "
                  "(median of %d) | ratio %.2f (ideal %d)\n",
                  n, n, one, cores, all, k, all / one, cores);
    }
  } catch (const error& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
