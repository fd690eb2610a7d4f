#include "backends/model/causal_lm.hpp"
#include "backends/model/causal_lm_impl.hpp"

#include <c10/core/GradMode.h>
#include <unordered_set>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include "backends/error.hpp"
#include "backends/model/attention.hpp"
#include "backends/model/hf_checkpoint.hpp"
#include "backends/model/init.hpp"
#include "backends/model/mixed_linear.hpp"
#include "backends/model/safetensors.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

using namespace model_detail;

// -- kv_cache -------------------------------------------------------------------------------------

int64_t kv_cache::length() const {
  return keys.empty() || !keys.front().defined() ? 0 : keys.front().size(2);
}

int64_t kv_cache::batch_size() const {
  return keys.empty() || !keys.front().defined() ? 0 : keys.front().size(0);
}

void kv_cache::reorder_or_select(const at::Tensor& batch_index) {
  if (keys.empty())
    return;
  if (!batch_index.defined() || batch_index.dim() != 1)
    fail(error_code::invalid_argument, "kv_cache::reorder_or_select: batch_index must be a 1-D "
                                       "int64 tensor");
  auto index = batch_index.to(keys.front().device(), at::kLong);
  auto rows = batch_size();
  if (index.numel() > 0) {
    auto lo = index.min().item<int64_t>();
    auto hi = index.max().item<int64_t>();
    if (lo < 0 || hi >= rows)
      fail(error_code::out_of_range, "kv_cache::reorder_or_select: row index " +
                                         std::to_string(lo < 0 ? lo : hi) +
                                         " outside the cached batch of " + std::to_string(rows));
  }
  for (auto& k : keys)
    k = k.index_select(0, index);
  for (auto& v : values)
    v = v.index_select(0, index);
}

void kv_cache::clear() {
  keys.clear();
  values.clear();
}

// -- model
// ------------------------------------------------------------------------------------------

namespace {

// The critic head is not part of the HF layout; it is stored next to the checkpoint.
constexpr const char* value_head_file = "value_head.safetensors";

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (x * at::rsqrt(variance + eps));
}

// HF's `x * cos + rotate_half(x) * sin` with rotate_half(x) = cat(-x2, x1), written as
// `x * cos + cat(x2, x1) * signed_sin` where signed_sin = cat(-sin1, sin2) is computed once per
// forward (saves a negation per call).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin) {
  auto half = x.size(-1) / 2;
  return x * cos + at::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * signed_sin;
}

// Rotary inverse frequencies as HF computes them: 1 / theta^(arange(0, d, 2) / d) in fp32, then
// adjusted by `rope_scaling` ("linear": divided by factor; "llama3": Llama 3.1's frequency-band
// smoothing). Other scaling types change more than the frequencies and are refused.
at::Tensor rotary_inv_freq(const model_config& c) {
  auto exponents =
      at::arange(0, c.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(c.head_dim);
  auto inv_freq = 1.0 / at::pow(c.rope_theta, exponents);
  const auto& rs = c.rope_scaling;
  if (rs.is_null())
    return inv_freq;
  auto type_field =
      rs.contains("rope_type") ? rs.at("rope_type") : rs.value("type", nlohmann::json("default"));
  if (!type_field.is_string())
    fail(error_code::invalid_argument,
         "rope_scaling type must be a string, got " + type_field.dump());
  const auto type = type_field.get<std::string>();
  auto number = [&](const char* key) {
    auto i = rs.find(key);
    if (i == rs.end() || !i->is_number())
      fail(error_code::invalid_argument,
           "rope_scaling of type '" + type + "' needs a number '" + key + "'");
    return i->get<double>();
  };
  if (type == "default")
    return inv_freq;
  if (type == "linear") {
    auto factor = number("factor");
    if (!(factor > 0))
      fail(error_code::invalid_argument,
           "rope_scaling factor must be > 0, got " + std::to_string(factor));
    return inv_freq / factor;
  }
  if (type == "llama3") {
    auto factor = number("factor");
    auto low = number("low_freq_factor");
    auto high = number("high_freq_factor");
    auto old_len = number("original_max_position_embeddings");
    if (!(factor > 0) || !(low > 0) || !(high > low) || !(old_len > 0))
      fail(error_code::invalid_argument, "rope_scaling llama3: need factor > 0, "
                                         "high_freq_factor > low_freq_factor > 0 and "
                                         "original_max_position_embeddings > 0, got " +
                                             rs.dump());
    const double pi = 3.14159265358979323846;
    auto wavelen = 2 * pi / inv_freq;
    auto low_wavelen = old_len / low;
    auto high_wavelen = old_len / high;
    auto scaled = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
    auto smooth = (old_len / wavelen - low) / (high - low);
    auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    return at::where(medium, smoothed, scaled);
  }
  fail(error_code::unsupported,
       "rope_scaling type '" + type + "' is not supported (supported: default, linear, llama3)");
}

// True when nothing but `t` (and, for a view, its otherwise unreferenced base) refers to the
// memory behind `t`, so rows outside `t` can be written without anyone else seeing them.
bool exclusively_owned(const at::Tensor& t) {
  if (t.use_count() != 1)
    return false; // e.g. a copied kv_cache shares this tensor
  size_t holders = 1;
  if (t.is_view()) {
    const auto& base = t._base();
    if (base.use_count() != 1 || base.is_view())
      return false;
    holders = 2;
  }
  return t.storage().use_count() == holders;
}

// Appends `x` [B, KV, n, d] to the cached `cached` [B, KV, T, d] along the time axis. The cache
// lives in a buffer [B, KV, capacity, d] and `cached` is a view of its first rows (possibly
// starting after some leading rows, when a caller narrowed the cache to drop common padding).
// When the buffer has room after the view and nothing else refers to it, the new rows are
// written in place; otherwise a buffer of twice the needed length (at most the model's context)
// is allocated and the rows copied. Generation thus copies each key once instead of at every
// step, and never overwrites rows another view (e.g. a copied cache) can see.
at::Tensor append_to_cache(const at::Tensor& cached, const at::Tensor& x, int64_t max_len) {
  // Under autograd (a cache while training) plain concatenation keeps the graph simple.
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || (cached.defined() && cached.requires_grad())))
    return cached.defined() ? at::cat({cached, x}, 2) : x;
  const int64_t b = x.size(0), kv = x.size(1), n = x.size(2), d = x.size(3);
  const int64_t t = cached.defined() ? cached.size(2) : 0;
  // Inference tensors may be written only inside InferenceMode.
  const bool writable =
      cached.defined() && (!cached.is_inference() || c10::InferenceMode::is_enabled());
  if (t > 0 && writable && exclusively_owned(cached) && cached.stride(3) == 1 &&
      cached.stride(2) == d && cached.stride(1) % d == 0 &&
      cached.stride(0) == kv * cached.stride(1) && cached.storage_offset() % d == 0) {
    const int64_t capacity = cached.stride(1) / d;
    const int64_t lead = cached.storage_offset() / d;
    const auto needed_bytes = static_cast<size_t>(b * kv * capacity * d) * x.element_size();
    if (lead + t + n <= capacity && cached.storage().nbytes() >= needed_bytes) {
      auto grown =
          at::empty({0}, cached.options())
              .set_(cached.storage(), cached.storage_offset(), {b, kv, t + n, d}, cached.strides());
      grown.narrow(2, t, n).copy_(x);
      return grown;
    }
  }
  const int64_t capacity = std::max(t + n, std::min(2 * (t + n), max_len));
  auto buffer = at::empty({b, kv, capacity, d}, x.options());
  if (t > 0)
    buffer.narrow(2, 0, t).copy_(cached);
  buffer.narrow(2, t, n).copy_(x);
  // A plain tensor over the buffer's storage rather than a view: a view would keep `buffer`
  // alive as its base and make the storage look shared.
  return at::empty({0}, x.options()).set_(buffer.storage(), 0, {b, kv, t + n, d}, buffer.strides());
}

using strings::shape_text;

// Activation checkpointing of one layer: forward runs without keeping activations; backward
// recomputes the layer with autograd (on the same random stream, for LoRA dropout) and
// differentiates it. The layer's parameters are inputs so their gradients flow; the model (the
// `layer_stack`) must outlive the backward pass.
struct layer_checkpoint_fn : torch::autograd::Function<layer_checkpoint_fn> {
  static torch::autograd::variable_list
  forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
          const at::Tensor& cos, const at::Tensor& signed_sin, const at::Tensor& cos_q,
          const at::Tensor& sin_q, const at::Tensor& bias, int64_t stack, int64_t li,
          int64_t batch, int64_t len, bool causal_only) {
    auto rng = at::detail::getDefaultCPUGenerator();
    ctx->saved_data["rng"] = rng.get_state();
    ctx->saved_data["stack"] = stack;
    ctx->saved_data["li"] = li;
    ctx->saved_data["batch"] = batch;
    ctx->saved_data["len"] = len;
    ctx->saved_data["causal_only"] = causal_only;
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    ctx->save_for_backward({x, cos, signed_sin, cos_q, sin_q, bias});
    c10::NoGradGuard no_grad;
    const auto* s = reinterpret_cast<const layer_stack*>(stack);
    layer_inputs in{cos, signed_sin, cos_q, sin_q, bias, batch, len, nullptr};
    in.causal_only = causal_only;
    return {s->layer_forward(static_cast<size_t>(li), x, in)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto* s = reinterpret_cast<const layer_stack*>(ctx->saved_data["stack"].toInt());
    const auto li = static_cast<size_t>(ctx->saved_data["li"].toInt());
    layer_inputs in{saved[1], saved[2], saved[3], saved[4], saved[5],
                    ctx->saved_data["batch"].toInt(), ctx->saved_data["len"].toInt(), nullptr};
    in.causal_only = ctx->saved_data["causal_only"].toBool();
    auto rng = at::detail::getDefaultCPUGenerator();
    auto resume = rng.get_state();
    rng.set_state(ctx->saved_data["rng"].toTensor());
    auto x = saved[0].detach().requires_grad_(ctx->needs_input_grad(0));
    at::Tensor y;
    {
      at::AutoGradMode grad_on(true);
      y = s->layer_forward(li, x, in);
    }
    rng.set_state(resume);
    auto params = s->layer_parameters(li);
    const auto n = static_cast<size_t>(ctx->saved_data["params"].toInt());
    std::vector<at::Tensor> wrt;
    std::vector<size_t> where; // wrt index -> output position (1 = x, 2.. = params)
    if (x.requires_grad()) {
      wrt.push_back(x);
      where.push_back(0);
    }
    for (size_t i = 0; i < params.size() && i < n; ++i)
      if (params[i].requires_grad()) {
        wrt.push_back(params[i]);
        where.push_back(1 + i);
      }
    torch::autograd::variable_list out(1 + n + 5 + 5); // x, params, 5 tensors, 4 ints, a bool
    if (wrt.empty() || !y.requires_grad())
      return out;
    auto g = torch::autograd::grad({y}, wrt, {grads[0]}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < g.size(); ++i)
      out[where[i]] = g[i];
    return out;
  }
};

at::Tensor checkpointed_layer(const layer_stack& stack, size_t li, const at::Tensor& x,
                              const layer_inputs& in) {
  auto params = stack.layer_parameters(li);
  // As a TensorList: a std::vector would not be recognised as autograd inputs.
  return layer_checkpoint_fn::apply(x, at::TensorList(params), in.cos, in.signed_sin, in.cos_q, in.sin_q, in.bias,
                                    reinterpret_cast<int64_t>(&stack), static_cast<int64_t>(li),
                                    in.batch, in.len, in.causal_only)[0];
}

} // namespace

at::Tensor causal_lm::impl::layer_forward(size_t li, const at::Tensor& x_in,
                                           const layer_inputs& in) const {
  const auto& c = config;
  const int64_t batch = in.batch, len = in.len;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t group = heads / kv_heads, head_dim = c.head_dim;
  const double eps = c.rms_norm_eps;
  const auto& l = layers[li];
  auto x = x_in;
  auto h = rms_norm(x, l.input_norm, eps);
  auto q = project(l.q, h).view({batch, len, heads, head_dim});
  auto k = project(l.k, h).view({batch, len, kv_heads, head_dim});
  auto v = project(l.v, h).view({batch, len, kv_heads, head_dim});
  if (l.q_norm.defined())
    q = rms_norm(q, l.q_norm, eps);
  if (l.k_norm.defined())
    k = rms_norm(k, l.k_norm, eps);
  q = apply_rotary(q, in.cos_q, in.sin_q);    // [B, T, H, d], pre-scaled
  k = apply_rotary(k, in.cos, in.signed_sin); // [B, T, KV, d]
  if (in.attention) {
    auto out = in.attention
                   ->attend(static_cast<int64_t>(li), q[0].contiguous(), k[0].contiguous(),
                            v[0].contiguous())
                   .unsqueeze(0);
    return finish_layer(l, x + project(l.o, out));
  }
  k = k.transpose(1, 2);                      // [B, KV, T, d]
  v = v.transpose(1, 2);
  if (in.cache) {
    auto& ck = in.cache->keys[li];
    auto& cv = in.cache->values[li];
    ck = append_to_cache(ck, k, c.max_position_embeddings);
    cv = append_to_cache(cv, v, c.max_position_embeddings);
    k = ck;
    v = cv;
  }
  // Grouped-query attention without repeating keys: the `group` query heads that share a
  // kv head are stacked along the query axis, so one batched matmul serves them all.
  auto qg = q.view({batch, len, kv_heads, group, head_dim})
                .permute({0, 2, 3, 1, 4})
                .reshape({batch, kv_heads, group * len, head_dim});
  auto out = attention(qg, k, v, in.bias, group,
                       batch_invariant ? attention_kernel::invariant : attention_kernel::gemm,
                       in.causal_only, gemm_scalar_type(compute)) // [B, KV, G*T, d]
                 .view({batch, kv_heads, group, len, head_dim})
                 .permute({0, 3, 1, 2, 4})
                 .reshape({batch, len, heads * head_dim});
  return finish_layer(l, x + project(l.o, out));
}

at::Tensor causal_lm::impl::finish_layer(const layer& l, const at::Tensor& x) const {
  auto h = rms_norm(x, l.post_attention_norm, config.rms_norm_eps);
  auto act = at::silu(project(l.gate, h)) * project(l.up, h);
  return x + project(l.down, act);
}

causal_lm::causal_lm(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

causal_lm::~causal_lm() = default;

const model_config& causal_lm::config() const {
  return impl_->config;
}

std::unique_ptr<causal_lm> causal_lm::load(const std::string& dir) {
  auto config = load_model_config(dir);
  auto weights = load_hf_weights(dir);
  auto head_path = std::filesystem::path(dir) / value_head_file;
  if (std::filesystem::exists(head_path))
    for (auto& [name, t] : read_safetensors(head_path.string()))
      weights[name] = t;
  // The freshly read tensors belong to nobody else: adopt them without a copy.
  return build(config, std::move(weights), /*own_storage=*/false);
}

std::unique_ptr<causal_lm> causal_lm::load_for_inference(const std::string& dir,
                                                         compute_dtype dtype) {
  if (dtype == compute_dtype::fp32) {
    auto model = load(dir);
    model->set_compute_dtype(dtype);
    return model;
  }
  auto config = load_model_config(dir);
  auto weights = load_hf_weights(dir, [](const std::string& name, at::ScalarType) {
    return is_gemm_weight(name) ? at::kBFloat16 : at::kFloat;
  });
  auto model = build(config, std::move(weights), /*own_storage=*/false, /*bf16_weights=*/true);
  model->store_weights_in_bf16(); // already bf16: sets the mode and freezes the weights
  return model;
}

std::unique_ptr<causal_lm> causal_lm::random(const model_config& config, uint64_t seed) {
  return build(config, random_hf_weights(config, seed), /*own_storage=*/false);
}

std::unique_ptr<causal_lm> causal_lm::from_weights(const model_config& config,
                                                   std::map<std::string, at::Tensor> weights) {
  return build(config, std::move(weights), /*own_storage=*/true);
}

std::unique_ptr<causal_lm> causal_lm::build(const model_config& config,
                                            std::map<std::string, at::Tensor> weights,
                                            bool own_storage, bool bf16_weights) {
  validate(config);
  auto p = std::make_unique<impl>();
  p->config = config;
  p->inv_freq = rotary_inv_freq(config);
  p->tied = config.tie_word_embeddings;
  at::Tensor value_head;
  if (auto i = weights.find("value_head.weight"); i != weights.end()) {
    value_head = i->second;
    weights.erase(i);
    if (value_head.dim() != 2 || value_head.size(0) != 1 ||
        value_head.size(1) != config.hidden_size)
      fail(error_code::invalid_argument, "value_head.weight has shape " +
                                             shape_text(value_head.sizes()) + ", expected [1, " +
                                             std::to_string(config.hidden_size) + "]");
  }
  // A tied checkpoint may still carry a copy of the embedding as lm_head.weight; HF ignores it.
  if (p->tied)
    weights.erase("lm_head.weight");
  check_weights_against_config(config, weights);

  auto take = [&](const std::string& name, bool required) -> at::Tensor {
    auto i = weights.find(name);
    if (i == weights.end()) {
      if (required)
        fail(error_code::not_found, "weight " + name + " is missing");
      return {};
    }
    const bool keep_bf16 = bf16_weights && is_gemm_weight(name);
    auto t = i->second.detach().to(keep_bf16 ? at::kBFloat16 : at::kFloat).contiguous();
    if (own_storage && t.data_ptr() == i->second.data_ptr())
      t = t.clone(); // never share storage with tensors the caller still holds
    weights.erase(i); // the file's copy goes as soon as the model holds the weight
    t.requires_grad_(!keep_bf16);
    p->base.emplace_back(name, t);
    return t;
  };
  p->embed = take("model.embed_tokens.weight", true);
  p->layers.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto& l = p->layers[static_cast<size_t>(i)];
    auto prefix = "model.layers." + std::to_string(i) + ".";
    l.input_norm = take(prefix + "input_layernorm.weight", true);
    for (auto& name : projection_names()) {
      auto& proj = l.by_name(name);
      bool attention = name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj";
      proj.path = prefix + (attention ? "self_attn." : "mlp.") + name;
      proj.weight = take(proj.path + ".weight", true);
      proj.bias = take(proj.path + ".bias", false);
    }
    l.q_norm = take(prefix + "self_attn.q_norm.weight", false);
    l.k_norm = take(prefix + "self_attn.k_norm.weight", false);
    l.post_attention_norm = take(prefix + "post_attention_layernorm.weight", true);
  }
  p->final_norm = take("model.norm.weight", true);
  p->head.path = "lm_head";
  p->head.weight = p->tied ? p->embed : take("lm_head.weight", true);
  if (value_head.defined()) {
    p->value_head = value_head.detach().to(at::kFloat).clone();
    p->value_head.requires_grad_(true);
  }
  return std::unique_ptr<causal_lm>(new causal_lm(std::move(p)));
}

at::Tensor causal_lm::forward_hidden(const at::Tensor& input_ids) {
  if (!input_ids.defined() || input_ids.dim() != 2)
    fail(error_code::invalid_argument,
         "forward_hidden: input_ids must be [B, T], got " +
             (input_ids.defined() ? shape_text(input_ids.sizes()) : std::string("undefined")));
  auto b = input_ids.size(0);
  auto t = input_ids.size(1);
  const auto on = at::TensorOptions().dtype(at::kLong).device(input_ids.device());
  auto mask = at::ones({b, t}, on);
  auto positions = at::arange(t, on).unsqueeze(0).expand({b, t}).contiguous();
  return forward_hidden(input_ids, mask, positions, nullptr);
}

at::Tensor causal_lm::forward_hidden(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                     const at::Tensor& position_ids, kv_cache* cache) {
  const auto& c = impl_->config;
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.size(0) < 1 ||
      input_ids.size(1) < 1)
    fail(error_code::invalid_argument,
         "forward_hidden: input_ids must be a non-empty [B, T] tensor, got " +
             (input_ids.defined() ? shape_text(input_ids.sizes()) : std::string("undefined")));
  if (!at::isIntegralType(input_ids.scalar_type(), /*includeBool=*/false))
    fail(error_code::invalid_argument, "forward_hidden: input_ids must be an integer tensor");
  const int64_t batch = input_ids.size(0);
  const int64_t len = input_ids.size(1);
  const int64_t past = cache ? cache->length() : 0;
  const int64_t total = past + len;
  if (cache && past > 0) {
    if (static_cast<int64_t>(cache->keys.size()) != c.num_hidden_layers ||
        static_cast<int64_t>(cache->values.size()) != c.num_hidden_layers)
      fail(error_code::invalid_argument,
           "forward_hidden: kv_cache has " + std::to_string(cache->keys.size()) +
               " layers, the model has " + std::to_string(c.num_hidden_layers));
    if (cache->batch_size() != batch)
      fail(error_code::invalid_argument, "forward_hidden: kv_cache holds " +
                                             std::to_string(cache->batch_size()) +
                                             " rows but input_ids has " + std::to_string(batch));
  }
  if (total > c.max_position_embeddings)
    fail(error_code::invalid_argument, "forward_hidden: sequence length " + std::to_string(total) +
                                           " exceeds max_position_embeddings " +
                                           std::to_string(c.max_position_embeddings));
  auto ids = input_ids.to(impl_->embed.device(), at::kLong);
  {
    auto lo = ids.min().item<int64_t>();
    auto hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= c.vocab_size)
      fail(error_code::out_of_range,
           "forward_hidden: token id " + std::to_string(lo < 0 ? lo : hi) +
               " outside the vocabulary of size " + std::to_string(c.vocab_size));
  }
  if (!attention_mask.defined() || attention_mask.dim() != 2 || attention_mask.size(0) != batch ||
      attention_mask.size(1) != total)
    fail(error_code::invalid_argument,
         "forward_hidden: attention_mask must be [" + std::to_string(batch) + ", " +
             std::to_string(total) + "] (past + new tokens), got " +
             (attention_mask.defined() ? shape_text(attention_mask.sizes())
                                       : std::string("undefined")));
  if (!position_ids.defined() || position_ids.dim() != 2 || position_ids.size(0) != batch ||
      position_ids.size(1) != len)
    fail(error_code::invalid_argument,
         "forward_hidden: position_ids must be [" + std::to_string(batch) + ", " +
             std::to_string(len) + "], got " +
             (position_ids.defined() ? shape_text(position_ids.sizes())
                                     : std::string("undefined")));
  auto positions = position_ids.to(impl_->embed.device(), at::kLong);
  {
    auto lo = positions.min().item<int64_t>();
    auto hi = positions.max().item<int64_t>();
    if (lo < 0 || hi >= c.max_position_embeddings)
      fail(error_code::out_of_range, "forward_hidden: position id " +
                                         std::to_string(lo < 0 ? lo : hi) +
                                         " outside [0, max_position_embeddings " +
                                         std::to_string(c.max_position_embeddings) + ")");
  }

  const auto rot = impl_->rotary_for(positions);

  // Additive mask [B, T, T_total]: causal, padding keys hidden, and every query may see
  // itself so a padding query's row is never fully masked (no NaN from softmax).
  const auto device = impl_->embed.device();
  auto key_real = attention_mask.to(device, at::kBool);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  auto query_pos = at::arange(past, total, longs).unsqueeze(1); // [T, 1]
  auto key_pos = at::arange(total, longs).unsqueeze(0);         // [1, T_total]
  auto causal = key_pos.le(query_pos);
  auto self = key_pos.eq(query_pos);
  auto allowed =
      causal.unsqueeze(0).logical_and(key_real.unsqueeze(1).logical_or(self.unsqueeze(0)));
  auto bias = at::zeros({batch, len, total}, at::TensorOptions().dtype(at::kFloat).device(device))
                  .masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  // On a CUDA device attention may take the fused causal kernel when nothing but causality
  // masks a key (one sync per forward pass; the CPU kernels always read the bias).
  const bool causal_only = device.is_cuda() && past == 0 && key_real.all().item<bool>();

  if (cache && past == 0) {
    cache->keys.assign(static_cast<size_t>(c.num_hidden_layers), at::Tensor());
    cache->values.assign(static_cast<size_t>(c.num_hidden_layers), at::Tensor());
  }

  auto x = impl_->embed_input(ids); // [B, T, hidden]
  layer_inputs in{rot.cos, rot.sin, rot.cos_q, rot.sin_q, bias, batch, len, cache};
  in.causal_only = causal_only;
  // Activation checkpointing applies where activations would be kept for a backward pass.
  const bool checkpoint = impl_->gradient_checkpointing && !cache && at::GradMode::is_enabled();
  for (size_t li = 0; li < impl_->layers.size(); ++li)
    x = checkpoint ? checkpointed_layer(*impl_, li, x, in) : impl_->layer_forward(li, x, in);
  return rms_norm(x, impl_->final_norm, c.rms_norm_eps);
}

at::Tensor causal_lm::forward_tokens(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                     attention_hook& attention) {
  c10::NoGradGuard no_grad;
  const auto& c = impl_->config;
  if (!input_ids.defined() || input_ids.dim() != 1 || input_ids.size(0) < 1 ||
      !at::isIntegralType(input_ids.scalar_type(), /*includeBool=*/false))
    fail(error_code::invalid_argument,
         "forward_tokens: input_ids must be a non-empty 1-D integer tensor, got " +
             (input_ids.defined() ? shape_text(input_ids.sizes()) : std::string("undefined")));
  const int64_t n = input_ids.size(0);
  if (!position_ids.defined() || position_ids.dim() != 1 || position_ids.size(0) != n)
    fail(error_code::invalid_argument,
         "forward_tokens: position_ids must be [" + std::to_string(n) + "], got " +
             (position_ids.defined() ? shape_text(position_ids.sizes())
                                     : std::string("undefined")));
  auto ids = input_ids.to(impl_->embed.device(), at::kLong);
  auto positions = position_ids.to(impl_->embed.device(), at::kLong);
  auto check_range = [](const at::Tensor& t, int64_t limit, const char* what) {
    auto lo = t.min().item<int64_t>();
    auto hi = t.max().item<int64_t>();
    if (lo < 0 || hi >= limit)
      fail(error_code::out_of_range, std::string{"forward_tokens: "} + what + " " +
                                         std::to_string(lo < 0 ? lo : hi) + " outside [0, " +
                                         std::to_string(limit) + ")");
  };
  check_range(ids, c.vocab_size, "token id");
  check_range(positions, c.max_position_embeddings, "position id");
  const auto rot = impl_->rotary_for(positions.unsqueeze(0));
  auto x = impl_->embed_input(ids).unsqueeze(0); // [1, N, hidden]
  layer_inputs in{rot.cos, rot.sin, rot.cos_q, rot.sin_q, at::Tensor(), 1, n, nullptr};
  in.attention = &attention;
  for (size_t li = 0; li < impl_->layers.size(); ++li)
    x = impl_->layer_forward(li, x, in);
  return rms_norm(x, impl_->final_norm, c.rms_norm_eps)[0];
}

at::Tensor causal_lm::logits(const at::Tensor& hidden) {
  if (!hidden.defined() || hidden.dim() < 1 || hidden.size(-1) != impl_->config.hidden_size)
    fail(error_code::invalid_argument,
         "logits: hidden states must end in hidden_size " +
             std::to_string(impl_->config.hidden_size) + ", got " +
             (hidden.defined() ? shape_text(hidden.sizes()) : std::string("undefined")));
  return impl_->project(impl_->head, hidden);
}

const at::Tensor& causal_lm::lm_head_weight() const {
  return impl_->head.weight;
}

causal_lm::head_adapter causal_lm::lm_head_adapter() const {
  const auto& h = impl_->head;
  if (!h.lora_a.defined())
    return {};
  return {h.lora_a, h.lora_b, impl_->lora.scaling()};
}

void causal_lm::untie_word_embeddings() {
  impl_->untie();
}

void causal_lm::add_value_head(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto std = 1.0 / static_cast<double>(impl_->config.hidden_size + 1);
  impl_->value_head = at::empty({1, impl_->config.hidden_size}, at::kFloat)
                          .normal_(0.0, std, gen)
                          .to(impl_->embed.device());
  impl_->value_head.requires_grad_(true);
}

bool causal_lm::has_value_head() const {
  return impl_->value_head.defined();
}

at::Tensor causal_lm::values(const at::Tensor& hidden) {
  if (!has_value_head())
    fail(error_code::invalid_argument, "values: the model has no value head (add_value_head)");
  if (!hidden.defined() || hidden.dim() != 3 || hidden.size(2) != impl_->config.hidden_size)
    fail(error_code::invalid_argument,
         "values: hidden states must be [B, T, " + std::to_string(impl_->config.hidden_size) +
             "], got " +
             (hidden.defined() ? shape_text(hidden.sizes()) : std::string("undefined")));
  return at::linear(hidden, impl_->value_head).squeeze(-1);
}

std::vector<std::pair<std::string, at::Tensor>> causal_lm::named_parameters() const {
  auto out = impl_->base;
  if (impl_->value_head.defined())
    out.emplace_back("value_head.weight", impl_->value_head);
  impl_->for_each_projection([&](const projection& p, const std::string&) {
    if (p.lora_a.defined()) {
      out.emplace_back(p.path + ".lora_A.weight", p.lora_a);
      out.emplace_back(p.path + ".lora_B.weight", p.lora_b);
    }
  });
  return out;
}

std::vector<at::Tensor> causal_lm::trainable_parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : named_parameters())
    if (t.requires_grad())
      out.push_back(t);
  return out;
}

std::map<std::string, at::Tensor> causal_lm::state_dict() const {
  c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : impl_->base)
    out[name] = t.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  // An adapter on a tied lm_head makes it differ from the embedding: it is written on its own.
  if (impl_->tied && impl_->head.lora_a.defined())
    out["lm_head.weight"] = impl_->embed.detach().to(at::kFloat, false, true);
  impl_->for_each_projection([&](const projection& p, const std::string&) {
    if (p.lora_a.defined()) {
      auto& w = out[p.path + ".weight"];
      w = merged_lora_weight(w, p.lora_a, p.lora_b, impl_->lora.scaling());
    }
  });
  if (impl_->value_head.defined())
    out["value_head.weight"] = impl_->value_head.detach().clone();
  return out;
}

void causal_lm::save_hf(const std::string& dir) const {
  auto weights = state_dict();
  // The weights are written as they live here, in fp32; config.json must say so.
  auto config = impl_->config;
  config.torch_dtype = "float32";
  if (weights.count("lm_head.weight"))
    config.tie_word_embeddings = false;
  auto value_head = weights.find("value_head.weight");
  if (value_head == weights.end()) {
    save_hf_checkpoint(dir, config, weights);
    std::filesystem::remove(std::filesystem::path(dir) / value_head_file);
    return;
  }
  std::map<std::string, at::Tensor> head{{value_head->first, value_head->second}};
  weights.erase(value_head);
  save_hf_checkpoint(dir, config, weights);
  write_safetensors((std::filesystem::path(dir) / value_head_file).string(), head,
                    {{"format", "pt"}});
}

int64_t causal_lm::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters())
    n += t.numel();
  return n;
}

int64_t causal_lm::num_trainable_parameters() const {
  int64_t n = 0;
  for (auto& t : trainable_parameters())
    n += t.numel();
  return n;
}

} // namespace rlforge::backends
