#include "backends/blas_info.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/version.h>

#include <dlfcn.h>

#include "backends/error.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rlforge::backends {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string basename_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The directory holding the file: "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3" → "blas".
std::string parent_name_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0)
    return {};
  auto before = path.rfind('/', slash - 1);
  auto from = before == std::string::npos ? 0 : before + 1;
  return path.substr(from, slash - from);
}

bool is_blas_name(const std::string& base) {
  auto b = lower(base);
  if (!starts_with(b, "lib") || !contains(b, ".so"))
    return false;
  // GPU BLAS libraries of a CUDA / ROCm build are not the CPU BLAS libtorch uses.
  for (const char* gpu : {"cublas", "hipblas", "rocblas"})
    if (contains(b, gpu))
      return false;
  for (const char* cpu : {"blas", "lapack", "mkl_", "blis", "atlas"})
    if (contains(b, cpu))
      return true;
  return false;
}

std::string resolve(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr)
    return buf;
  return path;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string trim(const std::string& s) {
  auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos)
    return {};
  auto last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

bool is_unknown(const std::string& library) {
  return starts_with(library, "unknown");
}

} // namespace

std::string classify_blas_path(const std::string& path) {
  auto p = lower(path);
  auto base = basename_of(p);
  auto dir = parent_name_of(p);
  if (contains(base, "mkl"))
    return "mkl";
  // Debian / Ubuntu keep each OpenBLAS flavour in its own directory (all of them name the
  // library itself libopenblasp-*), selected through update-alternatives.
  if (dir == "openblas-openmp")
    return "openblas-openmp";
  if (dir == "openblas-pthread")
    return "openblas-pthread";
  if (dir == "openblas-serial")
    return "openblas-serial";
  if (starts_with(base, "libopenblas"))
    return "openblas";
  if (dir == "atlas" || starts_with(base, "libatlas") || starts_with(base, "libtatlas") ||
      starts_with(base, "libsatlas"))
    return "atlas";
  if (dir == "blis-openmp" || dir == "blis-pthread" || dir == "blis-serial" ||
      starts_with(base, "libblis"))
    return "blis";
  if (starts_with(base, "libblas.so") || starts_with(base, "libcblas.so") ||
      starts_with(base, "liblapack.so"))
    return "reference (netlib)";
  return "unknown: " + path;
}

std::vector<std::string> blas_libraries_in_maps(const std::string& maps_text) {
  std::vector<std::string> out;
  std::istringstream lines(maps_text);
  std::string line;
  while (std::getline(lines, line)) {
    // address perms offset dev inode [path]; the path may hold spaces.
    std::istringstream fields(line);
    std::string skip;
    for (int i = 0; i < 5; ++i)
      fields >> skip;
    std::string path;
    std::getline(fields, path);
    path = trim(path);
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() &&
        path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
      path.resize(path.size() - deleted.size());
    if (path.empty() || path.front() != '/' || !is_blas_name(basename_of(path)))
      continue;
    if (std::find(out.begin(), out.end(), path) == out.end())
      out.push_back(path);
  }
  return out;
}

blas_report inspect_blas() {
  {
    // A product that goes through gemm, so a BLAS loaded on first use is mapped below.
    c10::NoGradGuard no_grad;
    auto a = at::ones({64, 64}, at::kFloat);
    auto c = at::mm(a, a);
    if (c[0][0].item<float>() != 64.0f)
      fail(error_code::internal, "inspect_blas: a 64x64 product of ones gave " +
                                     std::to_string(c[0][0].item<float>()) + ", expected 64");
  }
  blas_report r;
  for (const auto& p : blas_libraries_in_maps(read_file("/proc/self/maps"))) {
    auto resolved = resolve(p);
    if (std::find(r.mapped.begin(), r.mapped.end(), resolved) == r.mapped.end())
      r.mapped.push_back(resolved);
  }
  // The object the dynamic linker binds `sgemm_` to is the BLAS libtorch calls.
  if (void* sym = ::dlsym(RTLD_DEFAULT, "sgemm_")) {
    Dl_info info{};
    if (::dladdr(sym, &info) != 0 && info.dli_fname != nullptr)
      r.path = resolve(info.dli_fname);
  }
  if (!r.path.empty())
    r.library = classify_blas_path(r.path);
  if (r.path.empty() || is_unknown(r.library)) {
    // No visible sgemm_ (e.g. a BLAS linked statically into libtorch): fall back to the
    // first mapped library we can name, then to libtorch's own build description.
    for (const auto& m : r.mapped) {
      if (!is_unknown(classify_blas_path(m))) {
        r.path = m;
        r.library = classify_blas_path(m);
        break;
      }
    }
  }
  if (r.library.empty() || is_unknown(r.library)) {
    auto config = at::show_config();
    if (contains(config, "BLAS_INFO=mkl")) {
      r.library = "mkl";
      r.path = "(linked into libtorch)";
    } else if (r.library.empty()) {
      r.library = "unknown: no BLAS library is mapped into this process";
    }
  }
  r.torch_threads = at::get_num_threads();
  auto info = at::get_parallel_info();
  std::istringstream lines(info);
  std::string line;
  std::string summary;
  while (std::getline(lines, line)) {
    line = trim(line);
    if (line.empty())
      continue;
    const std::string key = "ATen parallel backend:";
    if (starts_with(line, key))
      r.parallel_backend = trim(line.substr(key.size()));
    if (line.back() == ':')
      line.pop_back(); // a section heading such as "ATen/Parallel:"
    summary += (summary.empty() ? "" : "; ") + line;
  }
  r.parallel_summary = summary;
  r.torch_version = TORCH_VERSION;
  return r;
}

std::string blas_warning(const blas_report& r) {
  if (r.library == "reference (netlib)")
    return "WARNING: libtorch is using the reference BLAS (" + r.path +
           "): matrix products run ~30x slower; run scripts/setup to select OpenBLAS-OpenMP";
  if (r.library == "openblas-pthread")
    return "WARNING: libtorch is using pthread OpenBLAS (" + r.path +
           "): its threads oversubscribe the cores together with torch's OpenMP threads "
           "(~3x slower); run scripts/setup to select OpenBLAS-OpenMP";
  return {};
}

double measure_gemm_gflops(int n, int threads, int reps, compute_dtype dtype) {
  if (n < 1 || n > 8192)
    fail(error_code::invalid_argument,
         "measure_gemm_gflops: n must be in [1, 8192], got " + std::to_string(n));
  if (threads < 0)
    fail(error_code::invalid_argument,
         "measure_gemm_gflops: threads must be >= 0 (0 = current), got " + std::to_string(threads));
  if (reps < 1 || reps > 1000)
    fail(error_code::invalid_argument,
         "measure_gemm_gflops: reps must be in [1, 1000], got " + std::to_string(reps));

  // torch's thread count is per OS thread: restore the caller's setting however we leave.
  struct restore_threads {
    int previous;
    bool active;
    ~restore_threads() {
      if (active)
        at::set_num_threads(previous);
    }
  } restore{at::get_num_threads(), threads > 0};
  if (threads > 0)
    at::set_num_threads(threads);

  c10::NoGradGuard no_grad;
  const auto type = gemm_scalar_type(dtype);
  auto a = at::rand({n, n}, at::kFloat).to(type);
  auto b = at::rand({n, n}, at::kFloat).to(type);
  auto c = at::empty({n, n}, type);
  at::mm_out(c, a, b); // warm-up: page in the buffers, start the thread pool
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  auto median = seconds[seconds.size() / 2];
  // A clock tick can exceed a tiny product's time; never divide by zero.
  median = std::max(median, 1e-9);
  auto flops = 2.0 * double(n) * double(n) * double(n);
  return flops / median / 1e9;
}

} // namespace rlforge::backends
