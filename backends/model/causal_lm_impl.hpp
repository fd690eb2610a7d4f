#pragma once

// The inside of `causal_lm` (causal_lm.hpp), shared by its source files: causal_lm.cpp (building,
// the forward passes, parameters and checkpoints), causal_lm_lora.cpp (adapters) and
// causal_lm_precision.cpp (compute dtype, bf16 storage, devices, modes). Internal: not part of
// the model's interface. Thread-safety as `causal_lm`'s: none; one thread at a time.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/model/attention.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/lora.hpp"
#include "backends/model/mixed_linear.hpp"

namespace rlforge::backends {

namespace model_detail {

inline const std::vector<std::string>& projection_names() {
  static const std::vector<std::string> names{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};
  return names;
}

struct projection {
  std::string path; // e.g. model.layers.3.self_attn.q_proj
  at::Tensor weight, bias, lora_a, lora_b;
  mutable bf16_copy compute; // the weight in bf16 while the model computes in bf16
};

struct layer {
  projection q, k, v, o, gate, up, down;
  at::Tensor input_norm, post_attention_norm, q_norm, k_norm;

  projection& by_name(const std::string& name) {
    return const_cast<projection&>(static_cast<const layer&>(*this).by_name(name));
  }

  const projection& by_name(const std::string& name) const {
    if (name == "q_proj")
      return q;
    if (name == "k_proj")
      return k;
    if (name == "v_proj")
      return v;
    if (name == "o_proj")
      return o;
    if (name == "gate_proj")
      return gate;
    if (name == "up_proj")
      return up;
    return down;
  }
};

// What one decoder layer reads besides the residual stream: the rotary factors, the attention
// bias, the shapes and the KV cache of this forward pass; or, for a flattened pass
// (`forward_tokens`: batch 1, no bias, no cache), the hook that computes attention.
struct layer_inputs {
  at::Tensor cos, signed_sin, cos_q, sin_q, bias;
  int64_t batch = 0, len = 0;
  kv_cache* cache = nullptr;
  attention_hook* attention = nullptr;
  /// `bias` masks nothing but the future (no padding, no cache): a CUDA device may then take
  /// the fused causal attention kernel.
  bool causal_only = false;
};

// The decoder layers of a model, as the activation checkpoint sees them.
struct layer_stack {
  virtual ~layer_stack() = default;
  virtual at::Tensor layer_forward(size_t li, const at::Tensor& x, const layer_inputs& in) const = 0;
  virtual std::vector<at::Tensor> layer_parameters(size_t li) const = 0;
};

} // namespace model_detail

struct causal_lm::impl : model_detail::layer_stack {
  using layer = model_detail::layer;
  using layer_inputs = model_detail::layer_inputs;
  using projection = model_detail::projection;
  model_config config;
  at::Tensor embed, final_norm, value_head;
  projection head;     // the lm_head: weight is `embed` when tied; its adapter, when targeted
  at::Tensor inv_freq; // [head_dim / 2] fp32 rotary frequencies
  bool tied = false;
  std::vector<layer> layers;
  std::vector<std::pair<std::string, at::Tensor>> base; // HF names, live leaves
  lora_config lora;
  bool training = false;
  compute_dtype compute = compute_dtype::fp32;
  bool batch_invariant = false;
  bool gradient_checkpointing = false;

  /// The weight `p`'s GEMM multiplies by: its bf16 copy in bf16 mode (the weight itself when it
  /// is stored in bf16), undefined in fp32 mode (then the fp32 weight is used).
  at::Tensor compute_weight(const projection& p) const {
    return compute == compute_dtype::bf16 ? p.compute.of(p.weight) : at::Tensor();
  }

  /// Fewer rows than this are projected as this many in batch-invariant mode (see `project`):
  /// on an AVX-512-BF16/AMX CPU 1-4 rows differed from the same rows among 12 or more, which
  /// agreed; 16 is one AMX tile's rows.
  static constexpr int64_t invariant_min_rows = 16;

  at::Tensor project(const projection& p, const at::Tensor& x) const {
    const int64_t width = x.size(-1), rows = width > 0 ? x.numel() / width : 0;
    if (batch_invariant && rows > 0 && rows < invariant_min_rows) {
      // A few rows (a decode step of a few sequences): BLAS libraries switch to other kernels
      // for them, whose sums run in another order than their matrix kernel's, so a row's
      // projection would depend on how many rows share the call. Padded with copies of the
      // last row to `invariant_min_rows` rows; the copies' results are dropped.
      auto flat = x.reshape({rows, width});
      auto padded = at::cat({flat, flat.narrow(0, rows - 1, 1).expand(
                                       {invariant_min_rows - rows, width})},
                            0);
      auto y = project_rows(p, padded).narrow(0, 0, rows);
      auto shape = x.sizes().vec();
      shape.back() = y.size(-1);
      return y.reshape(shape);
    }
    return project_rows(p, x);
  }

  at::Tensor project_rows(const projection& p, const at::Tensor& x) const {
    return lora_linear(x, p.weight, p.bias, p.lora_a, p.lora_b, lora.rank > 0 ? lora.scaling() : 0,
                       lora.dropout, training, compute_weight(p));
  }

  /// Drops every bf16 copy (they are rebuilt on the next use).
  void reset_compute_copies() {
    for_each_projection([](const projection& p, const std::string&) { p.compute.reset(); });
  }

  /// Rotary factors for positions `[B, T]`: `cos`/`sin` for keys, `cos_q`/`sin_q` for queries
  /// (`[B, T, 1, head_dim]`; `sin` carries the sign of rotate_half).
  struct rotary {
    at::Tensor cos, sin, cos_q, sin_q;
  };

  rotary rotary_for(const at::Tensor& positions) const {
    // Rotary angles exactly as HF: angle = position * inv_freq in fp32, cat(f, f).
    auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq; // [B, T, d/2]
    auto emb = at::cat({freqs, freqs}, -1).unsqueeze(2);            // [B, T, 1, d]
    rotary r;
    r.cos = emb.cos();
    auto sin = emb.sin();
    const int64_t half = config.head_dim / 2;
    r.sin = at::cat({-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)}, -1);
    // The attention scale 1/sqrt(head_dim) is folded into the query's rotary factors, so the
    // [T, T_total] scores need no separate scaling pass (HF scales the scores; the results agree
    // to fp32 rounding, exactly when head_dim is a power of 4).
    const double scale = 1.0 / std::sqrt(static_cast<double>(config.head_dim));
    r.cos_q = r.cos * scale;
    r.sin_q = r.sin * scale;
    return r;
  }

  /// Every projection an adapter may target: the layers' seven, then the lm_head.
  template <class F> void for_each_projection(F&& f) {
    for (auto& l : layers)
      for (auto& name : model_detail::projection_names())
        f(l.by_name(name), name);
    f(head, "lm_head");
  }
  template <class F> void for_each_projection(F&& f) const {
    for (const auto& l : layers)
      for (auto& name : model_detail::projection_names())
        f(l.by_name(name), name);
    f(head, "lm_head");
  }

  /// Decoder layer `li` on the residual stream `x` [B, T, hidden] (see forward_hidden).
  at::Tensor layer_forward(size_t li, const at::Tensor& x_in, const layer_inputs& in) const override;

  /// The MLP half of a decoder layer on the residual stream after attention.
  at::Tensor finish_layer(const layer& l, const at::Tensor& x) const;

  /// The embeddings of `ids` as the fp32 residual stream. In bf16 they are the bf16 table's
  /// values whether the table is stored in bf16 (an engine) or is an fp32 master (a trainer), so
  /// both start from the same numbers. The rounding passes gradients through unchanged.
  at::Tensor embed_input(const at::Tensor& ids) const {
    auto x = at::embedding(embed, ids);
    if (compute == compute_dtype::bf16 && x.scalar_type() == at::kFloat)
      x = x.to(at::kBFloat16);
    return x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  }

  /// The tensors layer `li` reads that autograd may differentiate: its weights, biases, norms
  /// and adapters (undefined ones left out).
  std::vector<at::Tensor> layer_parameters(size_t li) const override {
    std::vector<at::Tensor> out;
    const auto& l = layers[li];
    for (const auto* t : {&l.input_norm, &l.post_attention_norm, &l.q_norm, &l.k_norm})
      if (t->defined())
        out.push_back(*t);
    for (auto& name : model_detail::projection_names()) {
      const auto& p = l.by_name(name);
      for (const auto* t : {&p.weight, &p.bias, &p.lora_a, &p.lora_b})
        if (t->defined())
          out.push_back(*t);
    }
    return out;
  }

  /// A tied lm_head gets its own copy of the embedding (a base parameter named lm_head.weight).
  void untie() {
    if (!tied)
      return;
    c10::NoGradGuard no_grad;
    head.weight = embed.detach().clone();
    head.weight.requires_grad_(embed.requires_grad());
    base.emplace_back("lm_head.weight", head.weight);
    tied = false;
    config.tie_word_embeddings = false;
  }
};

} // namespace rlforge::backends
