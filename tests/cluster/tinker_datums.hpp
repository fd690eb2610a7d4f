#pragma once
// Tinker datums the cluster tests and benchmarks train on (header-only).
#include <cstdint>
#include <vector>

#include "tinker/types.hpp"

namespace rlforge::cluster_test {

/// A supervised datum predicting `seq[1:]` from `seq[:-1]`, every target weighted 1 (at least
/// two tokens).
inline tinker::datum sft_datum(const std::vector<int64_t>& seq) {
  tinker::datum d;
  d.tokens.assign(seq.begin(), seq.end() - 1);
  auto& target = d.loss_fn_inputs["target_tokens"];
  target.type = tinker::dtype::int64;
  target.shape = {static_cast<int64_t>(seq.size() - 1)};
  target.ints.assign(seq.begin() + 1, seq.end());
  auto& weights = d.loss_fn_inputs["weights"];
  weights.type = tinker::dtype::float32;
  weights.shape = target.shape;
  weights.floats.assign(seq.size() - 1, 1.0);
  return d;
}

} // namespace rlforge::cluster_test
