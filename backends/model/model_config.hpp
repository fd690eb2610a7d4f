#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// Torch-free: configs are plain data.

namespace rlforge::backends {

/// The decoder-only families we implement, named as HF's `model_type`.
enum class architecture {
  llama, ///< LlamaForCausalLM
  qwen2, ///< Qwen2ForCausalLM: q/k/v projections always carry biases
  qwen3, ///< Qwen3ForCausalLM: per-head RMSNorm on q and k, explicit head_dim
};

/// HF `model_type` name: "llama", "qwen2" or "qwen3".
const char* to_string(architecture x) noexcept;

/// HF class name: "LlamaForCausalLM", "Qwen2ForCausalLM" or "Qwen3ForCausalLM".
const char* hf_class_name(architecture x) noexcept;

/// Accepts a `model_type` ("qwen2") or a class name ("Qwen2ForCausalLM"); throws
/// `error{unsupported}` naming anything else.
architecture parse_architecture(const std::string& name);

/// The fields of an HF config.json that our models use. Defaults are HF's own for the
/// architecture (see `parse_model_config`).
struct model_config {
  architecture arch = architecture::llama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  /// Grouped-query attention: heads share key/value heads; must divide num_attention_heads.
  int64_t num_key_value_heads = 32;
  /// Per-head width; q_proj has num_attention_heads × head_dim outputs.
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  /// HF's "rope_scaling" object as found (null when absent); passed through on export.
  nlohmann::json rope_scaling;
  int64_t max_position_embeddings = 2048;
  /// lm_head shares model.embed_tokens.weight (no lm_head.weight stored).
  bool tie_word_embeddings = false;
  /// q/k/v projections carry biases (always for qwen2).
  bool attention_bias = false;
  /// gate/up/down projections carry biases (llama only).
  bool mlp_bias = false;
  std::optional<int64_t> bos_token_id;
  /// config.json's "eos_token_id" may be one id or a list; empty when null/absent.
  std::vector<int64_t> eos_token_ids;
  /// "float32", "float16", "bfloat16" or "float64": the dtype weights are published in.
  std::string torch_dtype = "float32";
};

/// Parses an HF config.json object. The architecture comes from "architectures" and/or
/// "model_type" (they must agree); absent fields take HF's defaults for that architecture
/// (num_key_value_heads = num_attention_heads; head_dim = hidden_size / num_attention_heads,
/// 128 for qwen3; qwen2 attention_bias = true). Accepts "dtype" as newer HF writes it for
/// "torch_dtype". Throws `error{unsupported}` naming an unknown architecture,
/// `error{decode_error}` naming an ill-typed field, and whatever `validate` throws.
model_config parse_model_config(const nlohmann::json& j);

/// Reads and parses `dir`/config.json. Throws `error{not_found}` naming the path when it is
/// missing and `error{decode_error}` when it is not JSON.
model_config load_model_config(const std::string& dir);

/// An HF-compatible config.json object, including "architectures" and "model_type".
/// `parse_model_config(to_json(c))` gives back `c`.
nlohmann::json to_json(const model_config& c);

/// Checks sizes are positive, heads are divisible by key/value heads, head_dim is even (RoPE),
/// eps and theta are positive, token ids lie in [0, vocab_size), the dtype is known and the
/// flags fit the architecture. Throws `error{invalid_argument}` naming the field and value.
void validate(const model_config& c);

/// Named configurations for tests and benchmarks (all untied, rope_theta 10000, float32):
/// - "tiny":  llama, vocab 512, hidden 64, 2 layers, 4 heads, 2 kv heads, intermediate 128,
///            max_pos 512: 139,584 parameters.
/// - "tiny-qwen2": "tiny" as qwen2 (q/k/v biases): 139,840 parameters.
/// - "tiny-qwen3": "tiny" as qwen3 (head_dim 16, q/k norms): 139,648 parameters.
/// - "small": llama, vocab 4096, hidden 256, 4 layers, 8 heads, 4 kv heads, intermediate 688,
///            max_pos 2048: 4,999,424 parameters.
/// - "qwen2.5-0.5b": the shape of Qwen2.5-0.5B (qwen2, vocab 151,936, hidden 896, 24 layers,
///            14 heads, 2 kv heads, intermediate 4,864, tied embeddings, rope theta 1e6,
///            max_pos 32,768): 494,032,768 parameters, as the real model.
/// Throws `error{not_found}` listing the valid names for anything else.
model_config preset(const std::string& name);

/// Names `preset` accepts.
std::vector<std::string> preset_names();

/// Number of parameters in the HF layout of `c` (embedding, layers, final norm, lm_head
/// unless tied).
int64_t num_parameters(const model_config& c);

bool operator==(const model_config& a, const model_config& b);
inline bool operator!=(const model_config& a, const model_config& b) {
  return !(a == b);
}

} // namespace rlforge::backends
