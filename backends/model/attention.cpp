#include "backends/model/attention.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "backends/torch_compat.hpp"

namespace rlforge::backends {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Keys and values need rows of contiguous elements only: views of a cache's buffer or
// transposed projections are used without a copy.
at::Tensor rows_dense(const at::Tensor& t) {
  return t.stride(3) == 1 && t.stride(2) >= t.size(3) ? t.detach() : t.detach().contiguous();
}

// Each (batch row, kv head) slice is computed with single-threaded GEMMs inside one parallel loop
// over slices: one parallel region per call instead of one per elementwise op, and no per-GEMM
// thread hand-off for these small products.
void gemm_forward(const at::Tensor& qd, const at::Tensor& kd, const at::Tensor& vd,
                  const at::Tensor& bd, int64_t group, at::Tensor& probs, at::Tensor& out) {
  const int64_t kv_heads = qd.size(1), rows = qd.size(2), total = kd.size(2);
  const int64_t len = rows / group;
  at::parallel_for(0, qd.size(0) * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / kv_heads, h = i % kv_heads;
      auto p = probs[b][h]; // [G*T, T_total]
      at::mm_out(p, qd[b][h], kd[b][h].t());
      p.view({group, len, total}).add_(bd[b]);
      // Row-wise softmax in place; every row has at least one finite entry (its own key).
      p.sub_(std::get<0>(p.max(-1, /*keepdim=*/true))).exp_();
      p.div_(p.sum(-1, /*keepdim=*/true));
      auto o = out[b][h];
      at::mm_out(o, p, vd[b][h]);
    }
  });
}

// Accumulator lanes of the fixed-order dot product: element e goes to lane e % 16 and the lanes
// are summed in order, whatever vector width the compiler picks (no FMA contraction: ISO C++
// mode), so every caller and every CPU gets the same bits.
constexpr int lanes = 16;

// One query row of the batch-invariant kernel: scores of its allowed keys (bias 0) in key
// order, softmax with a sequential sum, and the weighted sum of values accumulated in key order.
// `probs_row` receives the probabilities (0 at masked keys, as the GEMM kernel's).
__attribute__((target_clones("avx512f", "avx2", "default"))) void
invariant_row(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
              const float* bias, int64_t total, int64_t d, float* probs_row, float* out) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < total; ++j) {
    if (bias[j] != 0.0f) {
      probs_row[j] = 0.0f;
      continue;
    }
    const float* kj = k + j * k_stride;
    float acc[lanes] = {};
    int64_t e = 0;
    for (; e + lanes <= d; e += lanes)
      for (int l = 0; l < lanes; ++l)
        acc[l] += q[e + l] * kj[e + l];
    for (; e < d; ++e)
      acc[e % lanes] += q[e] * kj[e];
    float s = 0.0f;
    for (int l = 0; l < lanes; ++l)
      s += acc[l];
    probs_row[j] = s;
    max = s > max ? s : max;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < total; ++j)
    if (bias[j] == 0.0f) {
      probs_row[j] = std::exp(probs_row[j] - max);
      sum += probs_row[j];
    }
  for (int64_t e = 0; e < d; ++e)
    out[e] = 0.0f;
  for (int64_t j = 0; j < total; ++j) {
    if (bias[j] != 0.0f)
      continue;
    probs_row[j] /= sum;
    const float p = probs_row[j];
    const float* vj = v + j * v_stride;
    for (int64_t e = 0; e < d; ++e)
      out[e] += p * vj[e];
  }
}

void invariant_forward(const at::Tensor& qd, const at::Tensor& kd, const at::Tensor& vd,
                       const at::Tensor& bd, int64_t group, at::Tensor& probs, at::Tensor& out) {
  const int64_t batch = qd.size(0), kv_heads = qd.size(1), rows = qd.size(2), d = qd.size(3);
  const int64_t total = kd.size(2), len = rows / group;
  const float* q = qd.data_ptr<float>();
  const float* k = kd.data_ptr<float>();
  const float* v = vd.data_ptr<float>();
  const float* bias = bd.data_ptr<float>();
  float* p = probs.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, batch * kv_heads * rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i % rows, h = (i / rows) % kv_heads, b = i / (rows * kv_heads);
      const int64_t t = r % len;
      invariant_row(q + i * d, k + b * kd.stride(0) + h * kd.stride(1), kd.stride(2),
                    v + b * vd.stride(0) + h * vd.stride(1), vd.stride(2),
                    bias + (b * len + t) * total, total, d, p + i * total, o + i * d);
    }
  });
}

struct attention_fn : torch::autograd::Function<attention_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& bias, int64_t group,
                               bool invariant) {
    auto qd = q.detach().contiguous();
    auto kd = rows_dense(k);
    auto vd = rows_dense(v);
    auto bd = bias.detach().contiguous();
    const int64_t batch = qd.size(0), kv_heads = qd.size(1), rows = qd.size(2);
    auto probs = at::empty({batch, kv_heads, rows, kd.size(2)}, qd.options());
    auto out = at::empty({batch, kv_heads, rows, qd.size(3)}, qd.options());
    if (invariant)
      invariant_forward(qd, kd, vd, bd, group, probs, out);
    else
      gemm_forward(qd, kd, vd, bd, group, probs, out);
    ctx->save_for_backward({qd, kd, vd, probs});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& qd = saved[0];
    const auto& kd = saved[1];
    const auto& vd = saved[2];
    const auto& probs = saved[3];
    auto grad_out = grads[0].contiguous();
    auto dq = at::empty_like(qd);
    auto dk = at::empty(kd.sizes(), kd.options());
    auto dv = at::empty(vd.sizes(), vd.options());
    const int64_t kv_heads = qd.size(1);
    at::parallel_for(0, qd.size(0) * kv_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / kv_heads, h = i % kv_heads;
        auto p = probs[b][h];
        auto go = grad_out[b][h];
        auto dv_s = dv[b][h];
        at::mm_out(dv_s, p.t(), go);
        // d scores = P * (dP - rowsum(dP * P)) with dP = dO V^T.
        auto ds = at::mm(go, vd[b][h].t());
        ds.sub_((ds * p).sum(-1, /*keepdim=*/true)).mul_(p);
        auto dq_s = dq[b][h];
        auto dk_s = dk[b][h];
        at::mm_out(dq_s, ds, kd[b][h]);
        at::mm_out(dk_s, ds.t(), qd[b][h]);
      }
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The CUDA path: one fused (or batched) call for every head at once, differentiated by
// autograd. Query head kv * G + g reads kv head kv, as the grouped layout stacks them.
at::Tensor device_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& bias, int64_t group, bool causal_only,
                            c10::ScalarType compute) {
  const int64_t batch = q.size(0), kv_heads = q.size(1), rows = q.size(2), d = q.size(3);
  const int64_t len = rows / group, total = k.size(2);
  auto qh = q.reshape({batch, kv_heads * group, len, d}).to(compute);
  auto kh = k.repeat_interleave(group, 1).to(compute);
  auto vh = v.repeat_interleave(group, 1).to(compute);
  at::Tensor out;
#if RLFORGE_TORCH_AT_LEAST(2, 1)
  // The queries carry the 1/sqrt(d) scale already.
  if (causal_only && len == total)
    out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true, 1.0);
  else
    out = at::scaled_dot_product_attention(qh, kh, vh, bias.unsqueeze(1).to(compute), 0.0,
                                           /*is_causal=*/false, 1.0);
#else
  auto scores = at::matmul(qh, kh.transpose(-1, -2)).to(at::kFloat) + bias.unsqueeze(1);
  out = at::matmul(at::softmax(scores, -1).to(compute), vh);
  (void)causal_only;
  (void)total;
#endif
  return out.to(q.scalar_type()).reshape({batch, kv_heads, rows, d});
}

} // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& bias, int64_t group, attention_kernel kernel,
                     bool causal_only, c10::ScalarType compute) {
  if (q.is_cuda())
    return device_attention(q, k, v, bias, group, causal_only, compute);
  return attention_fn::apply(q, k, v, bias, group, kernel == attention_kernel::invariant)[0];
}

} // namespace rlforge::backends
