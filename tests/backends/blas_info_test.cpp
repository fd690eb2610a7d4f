#include "backends/blas_info.hpp"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "backends/error.hpp"

using namespace rlforge::backends;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(BlasInfo, ClassifiesLibraryPaths) {
  struct row {
    const char* path;
    const char* expected;
  };
  const std::vector<row> table{
      {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3", "openblas-openmp"},
      {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblasp-r0.3.21.so", "openblas-openmp"},
      {"/usr/lib/x86_64-linux-gnu/openblas-openmp/liblapack.so.3", "openblas-openmp"},
      {"/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3", "openblas-pthread"},
      {"/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so", "openblas-pthread"},
      {"/usr/lib/x86_64-linux-gnu/openblas-serial/libblas.so.3", "openblas-serial"},
      {"/opt/OpenBLAS/lib/libopenblas.so.0", "openblas"},
      {"/usr/lib/x86_64-linux-gnu/blas/libblas.so.3", "reference (netlib)"},
      {"/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0", "reference (netlib)"},
      {"/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3.11.0", "reference (netlib)"},
      {"/usr/lib64/libcblas.so.3", "reference (netlib)"},
      {"/opt/intel/oneapi/mkl/latest/lib/intel64/libmkl_rt.so.2", "mkl"},
      {"/usr/lib/x86_64-linux-gnu/libmkl_intel_lp64.so", "mkl"},
      {"/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3", "atlas"},
      {"/usr/lib/x86_64-linux-gnu/blis-openmp/libblas.so.3", "blis"},
  };
  for (const auto& r : table)
    EXPECT_EQ(classify_blas_path(r.path), r.expected) << r.path;
  EXPECT_EQ(classify_blas_path("/usr/lib/libsomething.so"), "unknown: /usr/lib/libsomething.so");
  EXPECT_EQ(classify_blas_path(""), "unknown: ");
}

TEST(BlasInfo, FindsBlasLibrariesInAMapsFile) {
  const std::string maps =
      "55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123 /usr/bin/prog\n"
      "7f0000000000-7f0000001000 r--p 00000000 08:01 200 "
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3\n"
      "7f0000001000-7f0000002000 r-xp 00001000 08:01 200 "
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3\n"
      "7f0000003000-7f0000004000 r-xp 00000000 08:01 201 "
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblasp-r0.3.21.so\n"
      "7f0000005000-7f0000006000 r-xp 00000000 08:01 202 "
      "/usr/lib/x86_64-linux-gnu/libcublas.so.12\n"
      "7f0000007000-7f0000008000 r-xp 00000000 08:01 203 /usr/lib/x86_64-linux-gnu/libgomp.so.1\n"
      "7f0000009000-7f000000a000 rw-p 00000000 00:00 0 \n"
      "7f000000b000-7f000000c000 rw-p 00000000 00:00 0 [heap]\n"
      "7f000000d000-7f000000e000 r-xp 00000000 08:01 204 /opt/my libs/liblapack.so.3 (deleted)\n";
  auto found = blas_libraries_in_maps(maps);
  std::vector<std::string> expected{
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3",
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblasp-r0.3.21.so",
      "/opt/my libs/liblapack.so.3",
  };
  EXPECT_EQ(found, expected);
  EXPECT_TRUE(blas_libraries_in_maps("").empty());
  EXPECT_TRUE(blas_libraries_in_maps("garbage without fields\n\n").empty());
}

TEST(BlasInfo, ReportNamesTheLoadedLibraryAndTorchSettings) {
  auto r = inspect_blas();
  EXPECT_FALSE(r.library.empty());
  EXPECT_FALSE(r.path.empty());
  // This libtorch links libblas.so.3 dynamically, so something must be mapped and named.
  ASSERT_FALSE(r.mapped.empty());
  EXPECT_FALSE(r.library.rfind("unknown", 0) == 0) << r.library << " at " << r.path;
  EXPECT_EQ(classify_blas_path(r.path), r.library);
  for (const auto& m : r.mapped)
    EXPECT_EQ(m.front(), '/') << m;
  EXPECT_EQ(r.torch_threads, at::get_num_threads());
  EXPECT_FALSE(r.parallel_backend.empty()) << r.parallel_summary;
  EXPECT_TRUE(contains(r.parallel_summary, "at::get_num_threads()")) << r.parallel_summary;
  EXPECT_EQ(r.torch_version.rfind("1.", 0), 0u) << r.torch_version;
}

// Run in a child process by the next test: prints what this process's loader picked.
TEST(BlasInfoChild, PrintsTheDetectedLibrary) {
  if (std::getenv("RLFORGE_BLAS_INFO_CHILD") == nullptr)
    GTEST_SKIP() << "only runs as the child of DetectsTheReferenceBlasWhenTheLoaderPicksIt";
  auto r = inspect_blas();
  std::printf("\nblas-library=%s\nblas-warning=%s\n", r.library.c_str(), blas_warning(r).c_str());
}

TEST(BlasInfo, DetectsTheReferenceBlasWhenTheLoaderPicksIt) {
  // Debian installs the reference BLAS / LAPACK next to the alternatives' flavour folders;
  // putting their folders first on the loader path makes libtorch bind to them.
  auto current = inspect_blas();
  auto libdir = std::filesystem::path(current.path).parent_path();
  if (current.library.rfind("openblas-", 0) == 0)
    libdir = libdir.parent_path();
  auto blas_dir = libdir / "blas";
  auto lapack_dir = libdir / "lapack";
  if (!std::filesystem::exists(blas_dir / "libblas.so.3") ||
      !std::filesystem::exists(lapack_dir / "liblapack.so.3"))
    GTEST_SKIP() << "no reference BLAS installed under " << libdir;
  auto self = std::filesystem::read_symlink("/proc/self/exe");
  auto cmd = "RLFORGE_BLAS_INFO_CHILD=1 LD_LIBRARY_PATH=" + blas_dir.string() + ":" +
             lapack_dir.string() + " '" + self.string() +
             "' --gtest_filter=BlasInfoChild.PrintsTheDetectedLibrary 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr)
    output += buf.data();
  EXPECT_EQ(::pclose(pipe), 0) << output;
  EXPECT_TRUE(contains(output, "blas-library=reference (netlib)\n")) << output;
  EXPECT_TRUE(contains(output, "blas-warning=WARNING: libtorch is using the reference BLAS ("))
      << output;
}

TEST(BlasInfo, WarnsOnlyAboutSlowLibraries) {
  blas_report r;
  r.library = "reference (netlib)";
  r.path = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0";
  auto w = blas_warning(r);
  EXPECT_EQ(w.rfind("WARNING: ", 0), 0u) << w;
  EXPECT_TRUE(contains(w, "reference BLAS")) << w;
  EXPECT_TRUE(contains(w, r.path)) << w;
  EXPECT_TRUE(contains(w, "OpenBLAS-OpenMP")) << w;

  r.library = "openblas-pthread";
  r.path = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3";
  EXPECT_TRUE(contains(blas_warning(r), "oversubscribe")) << blas_warning(r);

  for (const char* fine : {"openblas-openmp", "openblas-serial", "mkl", "openblas"}) {
    r.library = fine;
    EXPECT_EQ(blas_warning(r), "") << fine;
  }
}

TEST(BlasInfo, GemmThroughputIsPositiveAndFinite) {
  auto g = measure_gemm_gflops(128, 0, 3);
  EXPECT_TRUE(std::isfinite(g));
  EXPECT_GT(g, 0.0);
  auto tiny = measure_gemm_gflops(1, 1, 1);
  EXPECT_TRUE(std::isfinite(tiny));
  EXPECT_GT(tiny, 0.0);
}

TEST(BlasInfo, GemmRestoresTheCallersThreadCount) {
  std::thread t([] {
    at::set_num_threads(1);
    measure_gemm_gflops(64, 2, 2);
    EXPECT_EQ(at::get_num_threads(), 1);
  });
  t.join();
}

TEST(BlasInfo, GemmRejectsBadArguments) {
  struct row {
    int n, threads, reps;
    const char* needle;
  };
  const std::vector<row> table{
      {0, 0, 1, "n must be in [1, 8192], got 0"},
      {-4, 0, 1, "got -4"},
      {8193, 0, 1, "got 8193"},
      {64, -1, 1, "threads must be >= 0 (0 = current), got -1"},
      {64, 0, 0, "reps must be in [1, 1000], got 0"},
      {64, 0, 1001, "got 1001"},
  };
  for (const auto& r : table) {
    try {
      measure_gemm_gflops(r.n, r.threads, r.reps);
      ADD_FAILURE() << "no error for n=" << r.n << " threads=" << r.threads << " reps=" << r.reps;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::invalid_argument);
      EXPECT_TRUE(contains(e.what(), r.needle)) << e.what();
    }
  }
}

} // namespace
