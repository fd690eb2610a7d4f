#pragma once

#include <c10/core/GradMode.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/model/compute_dtype.hpp"
#include "backends/model/lora.hpp"
#include "backends/model/model_config.hpp"

namespace rlforge::backends {

/// Per-layer key/value cache for incremental decoding. Keys/values are
/// `[B, num_kv_heads, T_past, head_dim]` (after rotary embedding).
struct kv_cache {
  std::vector<at::Tensor> keys, values; ///< one per layer, empty before the first forward

  /// T_past (0 when empty).
  int64_t length() const;

  /// Batch size of the cached rows (0 when empty).
  int64_t batch_size() const;

  /// Keeps the rows `batch_index` (int64 `[B']`) in that order, e.g. to drop finished rows.
  /// Throws `backends::error(out_of_range)` for an index outside the cached batch.
  void reorder_or_select(const at::Tensor& batch_index);

  /// Forgets everything.
  void clear();
};

/// Attention computed by the caller over keys/values it stores itself (the paged cache of
/// backends/engine), for `causal_lm::forward_tokens`.
class attention_hook {
public:
  virtual ~attention_hook() = default;

  /// Attention of layer `layer` for the N tokens of one forward pass: `q` `[N, heads, head_dim]`
  /// (rotary applied, pre-scaled by 1/sqrt(head_dim)), `k` `[N, kv_heads, head_dim]` (rotary
  /// applied) and `v` `[N, kv_heads, head_dim]`, all contiguous fp32. Query head j belongs to
  /// kv head j / (heads / kv_heads). Returns `[N, heads * head_dim]`: for each token, the
  /// softmax-weighted values over the positions it may see (its own sequence's, up to itself).
  virtual at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) = 0;
};

/// A decoder-only transformer with the numerics of Hugging Face's LlamaForCausalLM,
/// Qwen2ForCausalLM and Qwen3ForCausalLM (fp32 on CPU), optional LoRA adapters on the seven
/// projections of every layer, and an optional value head (critic).
///
/// Parameters are leaf tensors named as in HF checkpoints (`model.embed_tokens.weight`,
/// `model.layers.{i}.self_attn.q_proj.weight`, ..., `lm_head.weight` unless tied). LoRA tensors
/// are named `<projection path>.lora_A.weight` / `.lora_B.weight` (PEFT without the
/// `base_model.model.` prefix); the value head is `value_head.weight` `[1, hidden]`.
///
/// Rotary embeddings follow `config.rope_scaling`: none/"default", "linear" and "llama3" (Llama
/// 3.1); other types are refused with `backends::error(unsupported)` at construction.
///
/// Thread-safety: none; one owner drives a model. Inference callers should hold an
/// `c10::NoGradGuard` (base weights require grad unless LoRA is enabled).
class causal_lm {
public:
  /// Loads `dir/config.json` and its safetensors weights (sharded or not); bf16/f16 weights are
  /// upcast to fp32. A value head saved by `save_hf` (`dir/value_head.safetensors`, tensor
  /// `value_head.weight`) is loaded too.
  static std::unique_ptr<causal_lm> load(const std::string& dir);

  /// `load` for a model that only infers (engines, `rlforge score` / `generate`), computing in
  /// `dtype`. In bf16 the GEMM weights (`is_gemm_weight`) are read straight into bf16, a few MiB
  /// at a time, norms and biases into fp32, so no fp32 copy of a GEMM weight ever exists: the
  /// result is what `store_weights_in_bf16` makes (frozen), at about half the memory of fp32.
  static std::unique_ptr<causal_lm> load_for_inference(const std::string& dir,
                                                       compute_dtype dtype);

  /// HF-like random init: normal(0, 0.02) for projections and embeddings, ones for norms,
  /// zeros for biases; deterministic for a given `seed`.
  static std::unique_ptr<causal_lm> random(const model_config& config, uint64_t seed);

  /// Builds a model from HF-named weights, checked against `config` (shapes, names).
  static std::unique_ptr<causal_lm> from_weights(const model_config& config,
                                                 std::map<std::string, at::Tensor> weights);

  ~causal_lm();
  causal_lm(const causal_lm&) = delete;
  causal_lm& operator=(const causal_lm&) = delete;

  const model_config& config() const;

  /// Final-norm hidden states `[B, T, hidden]`. `attention_mask`: `[B, T_past + T]` int64/bool,
  /// 1 = real token, 0 = padding (left padding); `position_ids`: `[B, T]` int64 (for left-padded
  /// rows: cumulative sum of the mask minus 1, clamped at 0). When `cache != nullptr` the new
  /// keys/values are appended to it and attention covers cache + new tokens. Padding keys never
  /// influence real positions; a padding query attends only to itself (no NaN). Every id,
  /// padding included, must lie in `[0, vocab_size)`.
  at::Tensor forward_hidden(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                            const at::Tensor& position_ids, kv_cache* cache = nullptr);

  /// Unpadded convenience: mask of ones, positions 0..T-1, no cache.
  at::Tensor forward_hidden(const at::Tensor& input_ids);

  /// Final-norm hidden states `[N, hidden]` of N tokens of any number of sequences, flattened
  /// (`input_ids`, `position_ids`: `[N]` int64, each id in the vocabulary and each position
  /// below max_position_embeddings); `attention` stores the new keys/values and computes each
  /// layer's attention (which tokens see which is its business). Inference only (runs without
  /// autograd).
  at::Tensor forward_tokens(const at::Tensor& input_ids, const at::Tensor& position_ids,
                            attention_hook& attention);

  /// lm_head (tied or separate, plus its adapter when LoRA targets `lm_head`) applied to hidden
  /// states: `[..., vocab]` fp32.
  at::Tensor logits(const at::Tensor& hidden);

  /// The `[vocab, hidden]` matrix `logits()` multiplies by (the embedding when tied), without
  /// the adapter.
  const at::Tensor& lm_head_weight() const;

  /// The unembedding's low-rank adapter: `logits += scaling · (h Aᵀ) Bᵀ` with A `[rank, hidden]`,
  /// B `[vocab, rank]`; undefined tensors when LoRA does not target `lm_head`.
  struct head_adapter {
    at::Tensor a, b;
    double scaling = 0;
  };
  head_adapter lm_head_adapter() const;

  /// Gives the lm_head a storage of its own (a copy of the embedding) when it is tied, and marks
  /// the config untied: for a model that will receive an lm_head different from its embedding
  /// (the merged weights of a model whose unembedding was adapted). No-op when untied.
  void untie_word_embeddings();

  /// Adds a critic head `Linear(hidden, 1, bias=false)` named `value_head.weight`, initialised
  /// normal(0, 1/(hidden+1)) from `seed` (as TRL's value head). Replaces an existing one.
  void add_value_head(uint64_t seed);
  bool has_value_head() const;

  /// One value per token: `[B, T]` from hidden states `[B, T, hidden]`.
  /// Throws `backends::error(invalid_argument)` when there is no value head.
  at::Tensor values(const at::Tensor& hidden);

  /// Every parameter, in a stable order: base weights (HF names), then `value_head.weight`,
  /// then LoRA tensors. The tensors are the live leaves (an optimizer may update them).
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;

  /// The parameters with `requires_grad` (adapters and value head only when LoRA is on).
  std::vector<at::Tensor> trainable_parameters() const;

  /// Detached fp32 copies of the base weights under HF names with any LoRA update merged in
  /// (`lm_head.weight` when untied, or when an adapter on the tied lm_head makes it differ from
  /// the embedding), plus `value_head.weight` when present.
  std::map<std::string, at::Tensor> state_dict() const;

  /// Writes `dir/config.json` (torch_dtype float32; tie_word_embeddings false when the merged
  /// lm_head differs from the embedding) and `dir/model.safetensors` from `state_dict()` (LoRA
  /// merged); the
  /// value head, when present, goes to `dir/value_head.safetensors` so the HF files stay pure.
  void save_hf(const std::string& dir) const;

  /// Number of scalars over all parameters (tied weights counted once).
  int64_t num_parameters() const;

  /// Number of scalars over trainable parameters.
  int64_t num_trainable_parameters() const;

  /// Adds fresh adapters (A: kaiming-uniform with `seed`, B: zeros, so outputs do not change)
  /// and freezes the base weights. `config.rank` must be ≥ 1. Replaces existing adapters.
  void enable_lora(lora_config config, uint64_t seed);

  bool has_lora() const;

  /// The active adapter configuration (rank 0 when none).
  const lora_config& lora() const;

  /// Folds `scaling * B A` into each adapted base weight (an adapted tied lm_head is untied
  /// first), drops the adapters and makes the base trainable again.
  void merge_lora();

  /// Saves the adapters alone in PEFT's layout (`adapter_config.json`,
  /// `adapter_model.safetensors`). Throws `backends::error(invalid_argument)` without LoRA.
  void save_lora_adapter(const std::string& dir, const std::string& base_model = "") const;

  /// Loads adapters saved by `save_lora_adapter` (or PEFT) and freezes the base. A tensor whose
  /// shape disagrees with the model or the adapter's rank is a `backends::error(invalid_argument)`
  /// naming it.
  void load_lora_adapter(const std::string& dir);

  /// Training mode turns LoRA dropout on (no other layer uses dropout). Off by default.
  void set_training(bool on);
  bool training() const;

  /// The precision of the matrix products (compute_dtype.hpp); fp32 by default. In bf16 every
  /// projection and the lm_head multiply by a bf16 copy of their fp32 weight, made on first use
  /// and remade whenever the weight changed (its storage or autograd version: an optimizer
  /// step, a load, a `copy_`), so no forward pass casts the weights; gradients reach the fp32
  /// weights; norms, softmax, log-probs and the residual stream stay fp32. Switching to fp32
  /// drops the copies. Throws `backends::error(invalid_argument)` for fp32 on bf16-stored
  /// weights.
  void set_compute_dtype(compute_dtype dtype);
  compute_dtype compute_precision() const;

  /// Batch-invariant mode (off by default): attention visits each query's allowed keys in
  /// order with fixed-order reductions (attention.hpp), so a token's hidden state, and with it
  /// its log-prob, is the same bit for bit whatever else is in the batch and whether it is
  /// computed in a KV-cached decode step or a full forward pass. With bf16 compute (whose GEMMs
  /// are row-invariant here) an engine and a trainer in this mode agree exactly. Costs the
  /// attention's speed (docs/PERFORMANCE.md). A CPU kernel: refused (`error{unsupported}`) for
  /// a model on a CUDA device.
  void set_batch_invariant(bool on);
  bool batch_invariant() const;

  /// Activation checkpointing (off by default): while autograd records (training, no KV
  /// cache), each decoder layer keeps only its input and recomputes its activations in backward
  /// (on the same random stream, so LoRA dropout masks repeat). Same gradients, less memory,
  /// about one more forward pass of compute. The model must outlive the backward pass.
  void set_gradient_checkpointing(bool on);
  bool gradient_checkpointing() const;

  /// For inference holders (engines): stores the embedding, the projections and the lm_head in
  /// bf16 (half the memory, no copies), computes in bf16 and freezes every weight. Norms, biases
  /// and the value head stay fp32. Refused with LoRA adapters (merge them first).
  void store_weights_in_bf16();
  bool weights_in_bf16() const;

  /// True for the HF names `store_weights_in_bf16` stores in bf16: the embedding, the seven
  /// projections of each layer and `lm_head.weight` (not norms, biases, the value head or LoRA
  /// tensors). A sender of weights to a bf16 engine converts exactly these.
  static bool is_gemm_weight(const std::string& hf_name);

  /// The lm_head matrix the products use: its bf16 copy in bf16 mode, else `lm_head_weight()`.
  at::Tensor lm_head_compute_weight() const;

  /// Bytes held by the bf16 copies of fp32 weights (0 in fp32 mode or with bf16 storage).
  int64_t compute_copy_bytes() const;

  /// Frees the bf16 copies now (they are remade on the next use): before an offload, so that
  /// the device keeps none of the model.
  void drop_compute_copies();

  /// Moves every weight, adapter, value head, accumulated gradient and rotary table to
  /// `device`, in place: each parameter keeps its identity (an optimizer or a caller holding it
  /// sees it move), tied weights stay one tensor, the bf16 copies are remade on the next use.
  /// Inputs of later calls may live anywhere: they are moved to the model's device. Tensors
  /// shared with another model (a frozen LoRA base, actors/base_weights.hpp) move for it too.
  /// Not thread-safe; no forward or backward pass may be running. Throws `error{unsupported}`
  /// for a CUDA device while batch-invariant mode is on (a CPU kernel).
  void to(const c10::Device& device);

  /// Where the weights are (the CPU until `to`).
  c10::Device device() const;

private:
  struct impl;
  explicit causal_lm(std::unique_ptr<impl> p);
  /// `from_weights`; with `own_storage` false, fp32 contiguous tensors are adopted uncopied.
  static std::unique_ptr<causal_lm>
  build(const model_config& config, std::map<std::string, at::Tensor> weights, bool own_storage,
        bool bf16_weights = false);
  std::unique_ptr<impl> impl_;
};

} // namespace rlforge::backends
