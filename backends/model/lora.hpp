#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlforge::backends {

/// Low-rank adapter settings, as PEFT's LoraConfig. An adapted linear computes
/// `y = W x + b + (alpha / rank) * B(A(dropout(x)))` with `A: [rank, in]` and `B: [out, rank]`.
struct lora_config {
  /// Adapter rank r; 0 means no adapter.
  int64_t rank = 0;
  /// Scale numerator: the update is multiplied by `alpha / rank`.
  double alpha = 16.0;
  /// Which projections get an adapter, in PEFT naming (`q_proj`, ..., `down_proj`, and
  /// `lm_head`, the unembedding: Tinker's `train_unembed`). Short names (`q`, `gate`, ...,
  /// `unembed`) are accepted by `validate()` and normalised to PEFT naming.
  std::vector<std::string> target_modules = default_targets();
  /// Dropout probability applied to the adapter's input while training (0 = off).
  double dropout = 0.0;

  /// `alpha / rank`.
  double scaling() const;

  /// Checks rank ≥ 0, finite alpha, dropout in [0, 1), known and unique targets; normalises
  /// short target names. Throws `backends::error(invalid_argument)` naming the bad value.
  void validate();

  /// All seven projections of a Llama/Qwen decoder layer, in PEFT naming (not the lm_head).
  static std::vector<std::string> default_targets();
};

/// PEFT's `adapter_config.json` for `config` (`peft_type` LORA, `task_type` CAUSAL_LM).
nlohmann::json to_peft_json(const lora_config& config, const std::string& base_model);

/// Parses PEFT's `adapter_config.json`; rejects non-LoRA adapters, biases other than "none"
/// and unknown target modules with `backends::error(invalid_argument)`.
lora_config parse_peft_config(const nlohmann::json& j);

/// The PEFT tensor-name prefix in front of an HF parameter path: `base_model.model.`.
inline constexpr const char* peft_prefix = "base_model.model.";

/// A LoRA adapter on disk: its configuration and its tensors under PEFT names
/// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, ...).
struct lora_adapter {
  lora_config config;
  std::string base_model;
  std::map<std::string, at::Tensor> tensors;
};

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` (creates `dir`).
void save_lora_adapter(const std::string& dir, const lora_adapter& adapter);

/// Reads an adapter written by `save_lora_adapter` or by PEFT. Tensors are upcast to fp32.
/// Throws `backends::error(not_found)` when a file is missing.
lora_adapter load_lora_adapter(const std::string& dir);

/// The merged weight of an adapted linear: `base + scaling * (b_up a)`, computed in fp32 into a
/// new tensor (`base` is not changed). `causal_lm::state_dict()` and an engine merging synced
/// adapters (actors/weight_sync.hpp) both compute it here, so the two agree bit for bit.
at::Tensor merged_lora_weight(const at::Tensor& base, const at::Tensor& a, const at::Tensor& b_up,
                              double scaling);

/// `x W^T + b + scaling * (dropout(x) A^T) B^T`; `bias` may be undefined. `a`/`b_up` undefined
/// means no adapter. `dropout` is applied only when `training` is true. With `weight_bf16` (a
/// bf16 copy of `weight`, see mixed_linear.hpp) the base product runs in bf16 (`mixed_linear`);
/// the adapter's small products stay fp32. Throws `backends::error(invalid_argument)` naming the
/// shape when `a` is not [rank, in] or `b_up` is not [out, rank].
at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& a, const at::Tensor& b_up, double scaling,
                       double dropout = 0.0, bool training = false,
                       const at::Tensor& weight_bf16 = {});

} // namespace rlforge::backends
