#include "actors/node.hpp"

#include <algorithm>

#include "backends/devices.hpp"

namespace rlforge::actors {

node_resources local_node(const runtime::system_config& cfg) {
  auto node = runtime::local_node_resources(cfg);
  auto cuda = backends::cuda_device_count();
  if (cuda > 0) {
    node.gpus = cfg.gpus > 0 ? std::min(cfg.gpus, cuda) : cuda;
    node.virtual_gpus = false;
  }
  return node;
}

} // namespace rlforge::actors
