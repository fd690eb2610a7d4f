#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/model/model_config.hpp"
#include "backends/model/safetensors.hpp"

namespace rlforge::backends {

/// Loads the weights of an HF checkpoint directory in their stored dtypes: `model.safetensors`
/// if present (as HF prefers), else the shards listed by `model.safetensors.index.json`
/// ("weight_map"). Throws `error{not_found}` naming the missing file or shard,
/// `error{decode_error}` for an index that is malformed, names a shard outside `dir`, lists a
/// tensor its shard lacks, or for a tensor present in two shards (naming both). With `keep_as`,
/// each tensor is kept in the dtype it chooses, converted as it is read (`read_safetensors`).
std::map<std::string, at::Tensor> load_hf_weights(const std::string& dir,
                                                  const dtype_choice& keep_as = {});

/// A config plus the weights that were checked against it.
struct hf_checkpoint {
  model_config config;
  std::map<std::string, at::Tensor> weights;
};

/// `load_model_config(dir)` + `load_hf_weights(dir)` + `check_weights_against_config`.
hf_checkpoint load_hf_checkpoint(const std::string& dir);

/// Writes an HF checkpoint into `dir` (created if needed): config.json and either
/// model.safetensors or, when `max_shard_bytes` is set, shards model-0000i-of-0000n.safetensors
/// of at most that many data bytes each (a larger single tensor gets a shard of its own) plus
/// model.safetensors.index.json. Weights are written in their own dtypes with metadata
/// {"format": "pt"}. Files of the other layout left by an earlier save are removed. The weights
/// must match the config (`check_weights_against_config`). Throws `error{invalid_argument}`
/// for a bad config, mismatching weights or `max_shard_bytes` of 0; `error{io_error}` naming
/// the path when writing fails.
void save_hf_checkpoint(const std::string& dir, const model_config& config,
                        const std::map<std::string, at::Tensor>& weights,
                        std::optional<size_t> max_shard_bytes = std::nullopt);

/// HF tensor names of a model with config `c`, in a stable order: model.embed_tokens.weight,
/// per layer self_attn.{q,k,v,o}_proj.weight (+ .bias with attention_bias: q/k/v for qwen2,
/// q/k/v/o for llama and qwen3, as HF builds them),
/// self_attn.{q,k}_norm.weight (qwen3), mlp.{gate,up,down}_proj.weight (+ .bias with mlp_bias),
/// input_layernorm.weight, post_attention_layernorm.weight; then model.norm.weight and
/// lm_head.weight (absent when tied).
std::vector<std::string> expected_weight_names(const model_config& c);

/// The shape of every name in `expected_weight_names(c)` (torch Linear layout [out, in]).
std::map<std::string, std::vector<int64_t>> expected_weight_shapes(const model_config& c);

/// What differs between a set of weights and a config.
struct weight_check {
  std::vector<std::string> missing;    ///< expected names not present
  std::vector<std::string> unexpected; ///< present names not expected (nor ignorable)
  /// "name: expected [a, b], got [c, d]" for each shape mismatch.
  std::vector<std::string> shape_mismatches;

  bool ok() const noexcept {
    return missing.empty() && unexpected.empty() && shape_mismatches.empty();
  }
  /// One line listing every problem.
  std::string describe() const;
};

/// Compares `weights` with `expected_weight_shapes(c)`. Names ending in ".rotary_emb.inv_freq"
/// (a buffer HF sometimes stores) are ignored, as is lm_head.weight for a tied config.
weight_check compare_weights_to_config(const model_config& c,
                                       const std::map<std::string, at::Tensor>& weights);

/// Throws `error{invalid_argument}` with `compare_weights_to_config(c, weights).describe()`
/// when it is not ok.
void check_weights_against_config(const model_config& c,
                                  const std::map<std::string, at::Tensor>& weights);

} // namespace rlforge::backends
