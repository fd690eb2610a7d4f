#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "backends/model/model_config.hpp"

namespace rlforge::backends {

/// HF-like random weights for `config`, under HF names (`expected_weight_names(config)`), fp32:
/// normal(0, `std`) for embeddings and projection matrices, ones for RMSNorm weights (including
/// qwen3's q_norm/k_norm), zeros for biases. The tensors are drawn in the stable name order from
/// one generator seeded with `seed`, so the same config and seed give the same weights.
/// Throws `backends::error(invalid_argument)` for an invalid config or `std` ≤ 0 / NaN.
std::map<std::string, at::Tensor> random_hf_weights(const model_config& config, uint64_t seed,
                                                    double std = 0.02);

} // namespace rlforge::backends
