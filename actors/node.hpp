#pragma once

#include "runtime/messages.hpp"
#include "runtime/system_config.hpp"

namespace rlforge::actors {

/// This node's resources: CPUs and memory from the configuration or the machine; GPUs are the
/// real CUDA devices in a CUDA build that finds some (unless `--gpus` asks for fewer), else
/// `--gpus N` virtual devices on which actors compute on the CPU.
node_resources local_node(const runtime::system_config& cfg);

} // namespace rlforge::actors
