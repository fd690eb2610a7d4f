// `rlforge info`: the node's resources, the BLAS libtorch loaded, and the build's features.
#include "cli/command.hpp"

#include <nlohmann/json.hpp>

#include "backends/blas_info.hpp"
#include "actors/node.hpp"
#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "runtime/cluster_protocol.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"

#include <caf/actor_system.hpp>
#include <caf/config.hpp>
#include <openssl/sha.h>

#include <cstdio>
#include <iostream>

namespace rlforge::cli {
namespace {

// -- BLAS and GEMM ------------------------------------------------------------------------------

constexpr int gemm_n = 1024;
constexpr int gemm_reps = 9;

/// Which BLAS libtorch runs on, torch's threading, measured fp32 and bf16 GEMM rates, and the
/// default compute dtype of training and inference, as the "blas", "torch", "gemm" and
/// "precision" members of the report.
nlohmann::json blas_section() {
  auto r = backends::inspect_blas();
  auto gflops = backends::measure_gemm_gflops(gemm_n, 0, gemm_reps);
  auto bf16_gflops =
      backends::measure_gemm_gflops(gemm_n, 0, gemm_reps, backends::compute_dtype::bf16);
  const auto& bf16 = backends::detect_bf16_support();
  auto warning = backends::blas_warning(r);
  nlohmann::json out;
  out["blas"] = {{"library", r.library},
                 {"path", r.path},
                 {"mapped", r.mapped},
                 {"warning", warning.empty() ? nlohmann::json() : nlohmann::json(warning)}};
  out["torch"] = {{"version", r.torch_version},
                  {"threads", r.torch_threads},
                  {"parallel_backend", r.parallel_backend},
                  {"parallel_info", r.parallel_summary}};
  out["gemm"] = {{"n", gemm_n},
                 {"dtype", "float32"},
                 {"threads", r.torch_threads},
                 {"reps", gemm_reps},
                 {"gflops", gflops},
                 {"bf16_gflops", bf16_gflops}};
  const auto forced = backends::compute_dtype_from_environment();
  out["precision"] = {{"default", backends::to_string(backends::default_compute_dtype())},
                      {"fast_bf16", bf16.fast},
                      {"reason", forced ? std::string("RLFORGE_COMPUTE_DTYPE=") +
                                              backends::to_string(*forced)
                                        : bf16.reason}};
  return out;
}

void print_blas_text(const nlohmann::json& s, std::ostream& out) {
  const auto& blas = s["blas"];
  const auto& torch = s["torch"];
  const auto& gemm = s["gemm"];
  out << "blas:    " << blas["library"].get<std::string>() << " ("
      << blas["path"].get<std::string>() << ")\n";
  out << "torch:   " << torch["version"].get<std::string>() << ", " << torch["threads"].get<int>()
      << " intra-op thread(s), " << torch["parallel_backend"].get<std::string>() << " backend\n";
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.1f", gemm["gflops"].get<double>());
  char bf16_rate[64];
  std::snprintf(bf16_rate, sizeof(bf16_rate), "%.1f", gemm["bf16_gflops"].get<double>());
  out << "gemm:    " << rate << " GFLOP/s fp32, " << bf16_rate << " GFLOP/s bf16 (" << gemm_n
      << "x" << gemm_n << ", " << gemm["threads"].get<int>() << " thread(s), median of "
      << gemm_reps << ")\n";
  const auto& precision = s["precision"];
  out << "dtype:   " << precision["default"].get<std::string>()
      << " by default for training and inference (" << precision["reason"].get<std::string>()
      << "; rlforge score / generate keep fp32)\n";
  if (!blas["warning"].is_null()) {
    auto w = blas["warning"].get<std::string>();
    out << "\n"
        << std::string(w.size(), '!') << "\n"
        << w << "\n"
        << std::string(w.size(), '!') << "\n";
  }
}

// -- node resources and build features -------------------------------------------------------

/// This node's declared resources ("node") and what the build can do ("features").
nlohmann::json node_section(const runtime::system_config& cfg) {
  auto node = actors::local_node(cfg);
  nlohmann::json out;
  out["node"] = {{"id", node.node_id},
                 {"cpus", node.cpus},
                 {"memory_bytes", node.memory_bytes},
                 {"gpus", node.gpus},
                 {"gpu_kind", node.virtual_gpus ? "virtual, compute on CPU" : "cuda"}};
  bool cuda = backends::built_with_cuda();
  out["features"] = {{"cuda", cuda},
                     {"collectives", cuda ? "gloo (CPU tensors), nccl (CUDA tensors)" : "gloo"},
                     {"caf_version", CAF_VERSION},
                     {"remoting", "caf io middleman (BASP over TCP)"},
                     {"wire_format", "msgpack tensor_blob v1"}};
  return out;
}

void print_node_text(const nlohmann::json& s, std::ostream& out) {
  const auto& n = s["node"];
  char mem[32];
  std::snprintf(mem, sizeof(mem), "%.1f",
                static_cast<double>(n["memory_bytes"].get<int64_t>()) / (1024.0 * 1024 * 1024));
  out << "node:    " << n["id"].get<std::string>() << ", " << n["cpus"].get<int>() << " CPUs, "
      << mem << " GiB, " << n["gpus"].get<int>() << " GPUs ("
      << n["gpu_kind"].get<std::string>() << ")\n";
  const auto& f = s["features"];
  out << "build:   cuda " << (f["cuda"].get<bool>() ? "on" : "off") << ", collectives "
      << f["collectives"].get<std::string>() << ", CAF " << f["caf_version"].get<int>() << ", "
      << f["wire_format"].get<std::string>() << "\n";
}

// -- the command --------------------------------------------------------------------------------

int run_info(const parsed_flags& flags) {
  // Node flags go through the runtime's configuration (same validation, env and INI file).
  runtime::system_config cfg;
  if (auto err = cfg.parse_args(flags.node_args())) {
    std::cerr << "rlforge info: " << error_message(err) << "\n";
    return 2;
  }
  nlohmann::json report = {{"version", rlforge_version()}};
  report.update(node_section(cfg));
  try {
    report.update(blas_section());
  } catch (const backends::error& e) {
    std::cerr << "rlforge info: " << e.what() << "\n";
    return 1;
  }
  if (flags.has("--json")) {
    std::cout << report.dump(2) << "\n";
    // Loud even when the JSON goes to a file.
    if (!report["blas"]["warning"].is_null())
      std::cerr << report["blas"]["warning"].get<std::string>() << "\n";
    return 0;
  }
  std::cout << "rlforge " << report["version"].get<std::string>() << "\n";
  print_node_text(report, std::cout);
  print_blas_text(report, std::cout);
  return 0;
}

const command_registrar reg{
    "info",
    {"node resources, BLAS in use and GEMM GFLOP/s, build features",
     {switch_flag("--json", "print the report as JSON")},
     "rlforge info --gpus 4 --json",
     {{"--gpus", "--cpus", "--memory-gb", "--node-id"}, false},
     run_info}};

} // namespace

std::string version_text() {
  runtime::system_config cfg;
  caf::actor_system sys{cfg};
  const auto wire = wire_signature(sys);
  std::string joined;
  for (const auto& line : wire)
    joined += line + "\n";
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(joined.data()), joined.size(), digest);
  char hex[17];
  for (int i = 0; i < 8; ++i)
    std::snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  const auto f = node_section(cfg)["features"];
  return std::string("rlforge ") + rlforge_version() + "\nbuild: cuda " +
         (f["cuda"].get<bool>() ? "on" : "off") + ", collectives " +
         f["collectives"].get<std::string>() + ", CAF " +
         std::to_string(f["caf_version"].get<int>()) + ", " +
         f["wire_format"].get<std::string>() + "\nwire signature: " + hex + " (sha256 prefix of " +
         std::to_string(wire.size()) + " message types and interfaces; nodes of another "
         "signature are refused)";
}

} // namespace rlforge::cli
