/// The weights the CUDA IPC test sends and its peer process checks (cuda_ipc_test.cpp,
/// cuda_ipc_peer.cpp): deterministic per version, in fp32 and bf16, one of them empty.
/// Header-only; safe from any thread.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/weights/weight_transport.hpp"

namespace rlforge::gpu_test {

struct weight_shape {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

inline const std::vector<weight_shape>& ipc_shapes() {
  static const std::vector<weight_shape> shapes{
      {"embed", {4096, 256}, at::kBFloat16}, {"layer.0.q", {256, 256}, at::kBFloat16},
      {"layer.0.norm", {256}, at::kFloat},   {"layer.1.up", {688, 256}, at::kBFloat16},
      {"empty", {0}, at::kFloat},            {"head", {4096, 256}, at::kFloat}};
  return shapes;
}

/// The values of `version` on the CPU (the same in every process).
inline backends::named_tensors ipc_weights(uint64_t version) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + version);
  backends::named_tensors out;
  for (const auto& s : ipc_shapes())
    out.emplace_back(s.name, at::randn(s.shape, gen, at::kFloat).to(s.dtype));
  return out;
}

} // namespace rlforge::gpu_test
