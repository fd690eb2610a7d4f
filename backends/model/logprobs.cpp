#include "backends/model/logprobs.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <string>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// `x yᵀ` in the dtype of `y` (bf16 operands take the fast bf16 GEMM), returned in fp32.
at::Tensor product_nt(const at::Tensor& x, const at::Tensor& y) {
  if (y.scalar_type() == at::kFloat)
    return at::mm(x, y.t());
  return at::mm(x.to(y.scalar_type()), y.t()).to(at::kFloat);
}

/// `x y` in the dtype of `y`, returned in fp32.
at::Tensor product_nn(const at::Tensor& x, const at::Tensor& y) {
  if (y.scalar_type() == at::kFloat)
    return at::mm(x, y);
  return at::mm(x.to(y.scalar_type()), y).to(at::kFloat);
}

/// The logits of rows `h` against `weight` (fp32, or bf16 for mixed precision: then the product
/// is a bf16 GEMM and the logits are fp32 from there on), plus the adapter's low-rank term (fp32)
/// when `a` is not empty: h Wᵀ + scaling · (h Aᵀ) Bᵀ.
at::Tensor head_logits(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& a,
                       const at::Tensor& b, double scaling) {
  auto z = product_nt(h, weight);
  if (a.numel() > 0)
    z.add_(at::linear(at::linear(h, a), b), scaling);
  return z;
}

// Chunked log-softmax-gather (+ entropy) over rows of hidden [N, H] against weight [V, H] and an
// optional adapter (A [r, H], B [V, r]). Forward keeps only [N] outputs; backward recomputes
// each chunk's logits, so peak memory is O(chunk * V) in both passes instead of O(N * V) -
// unless all N x V log-probs fit in `keep_bytes`: then forward keeps them for backward,
// which saves the lm_head product's recomputation (a third of the head's cost) where memory is
// not the problem (small vocabularies, short batches).
// Gradient w.r.t. the scaled logits z = (hWᵀ + s·hAᵀBᵀ)/τ:
//   d logp[t] / dz = onehot(t) - p
//   d H / dz       = -p * (log p + H)
// and from gz = dL/d(hWᵀ + s·hAᵀBᵀ): dh = gz W + s (gz B) A, dB = s gzᵀ (h Aᵀ), dA = s (gz B)ᵀ h.
struct chunked_logprob_fn : torch::autograd::Function<chunked_logprob_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& weight, const at::Tensor& weight_compute,
                               const at::Tensor& lora_a, const at::Tensor& lora_b,
                               const at::Tensor& targets, double temperature, int64_t chunk,
                               bool with_entropy, double scaling, int64_t keep_bytes) {
    const int64_t n = hidden.size(0);
    auto logprobs = at::empty({n}, hidden.options());
    auto entropy =
        with_entropy ? at::empty({n}, hidden.options()) : at::zeros({n}, hidden.options());
    const int64_t vocab = weight_compute.size(0);
    const bool for_backward = at::GradMode::is_enabled() &&
                              (hidden.requires_grad() || weight.requires_grad() ||
                               lora_a.requires_grad() || lora_b.requires_grad());
    at::Tensor kept; // [N, V]: every log-prob, when they fit the budget and backward will run
    if (for_backward && n * vocab * 4 <= keep_bytes)
      kept = at::empty({n, vocab}, hidden.options().dtype(at::kFloat));
    // What is kept exists whole anyway: one product over all rows then (larger, faster GEMMs).
    const int64_t step = kept.defined() ? n : chunk;
    for (int64_t s = 0; s < n; s += step) {
      auto len = std::min(step, n - s);
      auto logp = tempered_log_softmax(
          head_logits(hidden.narrow(0, s, len), weight_compute, lora_a, lora_b, scaling),
          temperature);
      if (kept.defined())
        kept.narrow(0, s, len).copy_(logp);
      logprobs.narrow(0, s, len).copy_(
          logp.gather(1, targets.narrow(0, s, len).unsqueeze(1)).squeeze(1));
      if (with_entropy)
        entropy.narrow(0, s, len).copy_(-(logp.exp() * logp).sum(-1));
    }
    ctx->save_for_backward({hidden, weight_compute, targets, lora_a, lora_b});
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["with_entropy"] = with_entropy;
    if (kept.defined())
      ctx->saved_data["kept"] = kept;
    if (!with_entropy)
      ctx->mark_non_differentiable({entropy});
    return {logprobs, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1]; // the compute weight (fp32 or bf16)
    const auto& targets = saved[2];
    const auto& lora_a = saved[3];
    const auto& lora_b = saved[4];
    const double scaling = ctx->saved_data["scaling"].toDouble();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool with_entropy = ctx->saved_data["with_entropy"].toBool();
    const auto kept_entry = ctx->saved_data.find("kept");
    const at::Tensor kept =
        kept_entry != ctx->saved_data.end() ? kept_entry->second.toTensor() : at::Tensor();
    const bool adapted = lora_a.numel() > 0;
    const bool need_hidden = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);
    const bool need_a = adapted && ctx->needs_input_grad(3);
    const bool need_b = adapted && ctx->needs_input_grad(4);
    at::Tensor grad_hidden, grad_weight, grad_a, grad_b;
    if (need_hidden)
      grad_hidden = at::empty_like(hidden);
    const int64_t n = hidden.size(0);
    const int64_t step = kept.defined() ? n : chunk;
    if (need_weight)
      grad_weight = at::zeros(weight.sizes(), hidden.options()); // fp32 (the master's dtype)
    if (need_a)
      grad_a = at::zeros_like(lora_a);
    if (need_b)
      grad_b = at::zeros_like(lora_b);
    const auto& g_lp = grads[0];
    const auto& g_ent = grads[1];
    const bool entropy_grad = with_entropy && g_ent.defined();
    for (int64_t s = 0; s < n && (need_hidden || need_weight || need_a || need_b); s += step) {
      auto len = std::min(step, n - s);
      auto h = hidden.narrow(0, s, len);
      auto logp = kept.defined()
                      ? kept.narrow(0, s, len)
                      : tempered_log_softmax(head_logits(h, weight, lora_a, lora_b, scaling),
                                             temperature);
      auto p = logp.exp();
      at::Tensor gz;
      if (g_lp.defined()) {
        auto g = g_lp.narrow(0, s, len).unsqueeze(1);
        gz = p * g.neg();
        gz.scatter_add_(1, targets.narrow(0, s, len).unsqueeze(1), g);
      } else {
        gz = at::zeros_like(p);
      }
      if (entropy_grad) {
        auto ent = -(p * logp).sum(-1, /*keepdim=*/true);
        gz -= p * (logp + ent) * g_ent.narrow(0, s, len).unsqueeze(1);
      }
      gz.div_(temperature);
      at::Tensor gz_b; // gz B: [len, r]
      if (adapted && (need_hidden || need_a))
        gz_b = at::matmul(gz, lora_b);
      // gz in the weight's dtype once, for both products.
      const auto gz_w = weight.scalar_type() == at::kFloat ? gz : gz.to(weight.scalar_type());
      if (need_hidden) {
        auto gh = product_nn(gz_w, weight);
        if (adapted)
          gh.add_(at::matmul(gz_b, lora_a), scaling);
        grad_hidden.narrow(0, s, len).copy_(gh);
      }
      if (need_weight) {
        if (weight.scalar_type() == at::kFloat)
          grad_weight.addmm_(gz.t(), h);
        else
          grad_weight.add_(product_nn(gz_w.t(), h.to(weight.scalar_type())));
      }
      if (need_b)
        grad_b.addmm_(gz.t(), at::linear(h, lora_a), 1.0, scaling);
      if (need_a)
        grad_a.addmm_(gz_b.t(), h, 1.0, scaling);
    }
    return {grad_hidden,  grad_weight,  at::Tensor(), grad_a,       grad_b,      at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

using strings::shape_text;

} // namespace

at::Tensor tempered_log_softmax(const at::Tensor& logits, double temperature) {
  return at::log_softmax(logits.div(temperature), -1);
}

token_logprobs_result chunked_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, double temperature,
                                             int64_t chunk_size, bool with_entropy,
                                             int64_t max_positions,
                                             const causal_lm::head_adapter& adapter,
                                             const at::Tensor& weight_compute,
                                             int64_t keep_bytes) {
  if (std::isnan(temperature) || temperature <= 0)
    fail(error_code::invalid_argument,
         "token_logprobs: temperature must be > 0, got " + std::to_string(temperature));
  if (chunk_size < 1)
    fail(error_code::invalid_argument,
         "token_logprobs: chunk_size must be >= 1, got " + std::to_string(chunk_size));
  if (!hidden.defined() || hidden.dim() != 3)
    fail(error_code::invalid_argument,
         "token_logprobs: hidden must be [B, T, H], got " +
             (hidden.defined() ? shape_text(hidden.sizes()) : std::string("undefined")));
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != hidden.size(2))
    fail(error_code::invalid_argument,
         "token_logprobs: weight must be [vocab, " + std::to_string(hidden.size(2)) + "], got " +
             (weight.defined() ? shape_text(weight.sizes()) : std::string("undefined")));
  if (!targets.defined() || targets.dim() != 2 || targets.size(0) != hidden.size(0) ||
      targets.size(1) != hidden.size(1))
    fail(error_code::invalid_argument,
         "token_logprobs: targets must be [" + std::to_string(hidden.size(0)) + ", " +
             std::to_string(hidden.size(1)) + "], got " +
             (targets.defined() ? shape_text(targets.sizes()) : std::string("undefined")));
  if (!at::isIntegralType(targets.scalar_type(), /*includeBool=*/false))
    fail(error_code::invalid_argument, "token_logprobs: targets must be an integer tensor");
  const int64_t len = hidden.size(1);
  if (max_positions >= 0 && len > max_positions)
    fail(error_code::invalid_argument, "token_logprobs: sequence length " + std::to_string(len) +
                                           " exceeds max_position_embeddings " +
                                           std::to_string(max_positions));
  const int64_t vocab = weight.size(0);
  auto flat_targets = targets.to(hidden.device(), at::kLong).reshape({-1}).contiguous();
  if (flat_targets.numel() > 0) {
    auto lo = flat_targets.min().item<int64_t>();
    auto hi = flat_targets.max().item<int64_t>();
    if (lo < 0 || hi >= vocab)
      fail(error_code::out_of_range,
           "token_logprobs: token id " + std::to_string(lo < 0 ? lo : hi) +
               " outside the vocabulary of size " + std::to_string(vocab));
  }
  const int64_t batch = hidden.size(0);
  auto flat_hidden = hidden.reshape({batch * len, hidden.size(2)});
  if (adapter.a.defined() && (adapter.a.dim() != 2 || adapter.a.size(1) != hidden.size(2) ||
                              !adapter.b.defined() || adapter.b.dim() != 2 ||
                              adapter.b.size(0) != vocab || adapter.b.size(1) != adapter.a.size(0)))
    fail(error_code::invalid_argument,
         "token_logprobs: the lm_head adapter must be A [r, " + std::to_string(hidden.size(2)) +
             "] and B [" + std::to_string(vocab) + ", r], got A " +
             shape_text(adapter.a.sizes()) +
             (adapter.b.defined() ? " and B " + shape_text(adapter.b.sizes()) : ""));
  // Without an adapter, empty tensors stand in for A and B (autograd functions take no
  // undefined inputs).
  auto none = at::empty({0}, hidden.options());
  if (weight_compute.defined() && weight_compute.sizes() != weight.sizes())
    fail(error_code::invalid_argument,
         "token_logprobs: the compute weight " + shape_text(weight_compute.sizes()) +
             " differs in shape from the weight " + shape_text(weight.sizes()));
  auto out = chunked_logprob_fn::apply(flat_hidden, weight,
                                       weight_compute.defined() ? weight_compute : weight,
                                       adapter.a.defined() ? adapter.a : none,
                                       adapter.b.defined() ? adapter.b : none, flat_targets,
                                       temperature, chunk_size, with_entropy, adapter.scaling,
                                       std::max<int64_t>(0, keep_bytes));
  token_logprobs_result r;
  r.logprobs = out[0].view({batch, len});
  if (with_entropy)
    r.entropy = out[1].view({batch, len});
  return r;
}

token_logprobs_result token_logprobs(causal_lm& model, const at::Tensor& hidden,
                                     const at::Tensor& targets, double temperature,
                                     int64_t chunk_size, bool with_entropy) {
  return chunked_token_logprobs(hidden, model.lm_head_weight(), targets, temperature, chunk_size,
                                with_entropy, model.config().max_position_embeddings,
                                model.lm_head_adapter(), model.lm_head_compute_weight());
}

token_logprobs_result sequence_logprobs(causal_lm& model, const at::Tensor& input_ids,
                                        const at::Tensor& attention_mask, double temperature,
                                        int64_t chunk_size, bool with_entropy) {
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.size(1) < 2)
    fail(error_code::invalid_argument,
         "sequence_logprobs: input_ids must be [B, S] with S >= 2, got " +
             (input_ids.defined() ? shape_text(input_ids.sizes()) : std::string("undefined")));
  if (!attention_mask.defined() || attention_mask.sizes() != input_ids.sizes())
    fail(error_code::invalid_argument,
         "sequence_logprobs: attention_mask must have the shape of input_ids " +
             shape_text(input_ids.sizes()));
  auto mask = attention_mask.to(at::kLong);
  auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  auto hidden = model.forward_hidden(input_ids, mask, positions);
  const int64_t s = input_ids.size(1);
  return token_logprobs(model, hidden.narrow(1, 0, s - 1), input_ids.narrow(1, 1, s - 1),
                        temperature, chunk_size, with_entropy);
}

std::vector<double> score_tokens(causal_lm& model, const std::vector<int64_t>& tokens,
                                 double temperature) {
  if (tokens.size() < 2)
    fail(error_code::invalid_argument,
         "score_tokens: need at least 2 tokens, got " + std::to_string(tokens.size()));
  c10::NoGradGuard no_grad;
  auto ids = at::tensor(at::ArrayRef<int64_t>(tokens), at::kLong).unsqueeze(0);
  auto r = sequence_logprobs(model, ids, at::ones_like(ids), temperature);
  auto lp = r.logprobs.squeeze(0).to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(lp.data_ptr<double>(), lp.data_ptr<double>() + lp.numel());
}

} // namespace rlforge::backends
