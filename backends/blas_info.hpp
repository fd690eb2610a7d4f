#pragma once

#include <string>
#include <vector>

#include "backends/model/compute_dtype.hpp"

namespace rlforge::backends {

/// Which BLAS libtorch runs its CPU matrix products with, and its threading settings.
struct blas_report {
  /// "openblas-openmp", "openblas-pthread", "openblas-serial", "openblas", "mkl",
  /// "reference (netlib)" or "unknown: <path>" (see `classify_blas_path`).
  std::string library;
  /// Resolved path (symlinks followed) of the library that provides `sgemm_`, or of the
  /// first BLAS mapped into the process when no `sgemm_` symbol is visible.
  std::string path;
  /// Every BLAS / LAPACK shared object mapped into this process, resolved, in map order.
  std::vector<std::string> mapped;
  /// torch's intra-op thread count on the calling OS thread.
  int torch_threads = 0;
  /// The parallel backend, e.g. "OpenMP", from `at::get_parallel_info()`.
  std::string parallel_backend;
  /// `at::get_parallel_info()` condensed to one line.
  std::string parallel_summary;
  /// The libtorch version the program was built against, e.g. "1.13.0".
  std::string torch_version;
};

/// Names the BLAS flavour a shared-object path belongs to (a pure function of the text):
/// ".../openblas-openmp/libblas.so.3" → "openblas-openmp", ".../openblas-pthread/..." →
/// "openblas-pthread", ".../openblas-serial/..." → "openblas-serial", another libopenblas →
/// "openblas", ".../blas/libblas.so.3" or ".../lapack/liblapack.so.3" → "reference (netlib)",
/// libmkl_* → "mkl", anything else → "unknown: <path>".
std::string classify_blas_path(const std::string& path);

/// Returns the BLAS / LAPACK shared objects named in `maps_text`, the contents of a
/// /proc/<pid>/maps file, in order of first appearance, each once (paths as written there).
std::vector<std::string> blas_libraries_in_maps(const std::string& maps_text);

/// Inspects this process: runs a small matrix product first so that a lazily loaded BLAS is
/// in, then reads /proc/self/maps and resolves the library that serves `sgemm_`.
blas_report inspect_blas();

/// One loud "WARNING: ..." line when `r` is a BLAS that makes training slow, naming its path
/// and the fix: the reference (netlib) BLAS (~30x slower), or pthread OpenBLAS (oversubscribes
/// the cores together with torch's OpenMP threads). Empty otherwise.
std::string blas_warning(const blas_report& r);

/// n×n matrix-product throughput in GFLOP/s with operands of `dtype` (fp32, or bf16 with the
/// product in bf16 as the bf16 GEMMs of mixed precision compute it): 2n³ divided by the median
/// time of `reps` products after one warm-up. `threads` > 0 runs with that many torch intra-op threads on the
/// calling thread (restored afterwards); 0 keeps the current setting. Throws
/// `error{invalid_argument}` for n outside [1, 8192], threads < 0 or reps outside [1, 1000].
double measure_gemm_gflops(int n = 1024, int threads = 0, int reps = 9,
                           compute_dtype dtype = compute_dtype::fp32);

} // namespace rlforge::backends
