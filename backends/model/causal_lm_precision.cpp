// causal_lm's compute dtype, bf16 storage, devices and modes (causal_lm.hpp).
#include "backends/model/causal_lm.hpp"
#include "backends/model/causal_lm_impl.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/lora.hpp"
#include "backends/model/safetensors.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

using namespace model_detail;
using strings::shape_text;

void causal_lm::set_training(bool on) {
  impl_->training = on;
}

void causal_lm::set_compute_dtype(compute_dtype dtype) {
  if (dtype == compute_dtype::fp32 && impl_->embed.scalar_type() != at::kFloat)
    fail(error_code::invalid_argument,
         "set_compute_dtype: the weights are stored in bf16; fp32 compute needs fp32 weights");
  impl_->compute = dtype;
  if (dtype == compute_dtype::fp32)
    impl_->reset_compute_copies();
}

compute_dtype causal_lm::compute_precision() const {
  return impl_->compute;
}

void causal_lm::set_batch_invariant(bool on) {
  if (on && impl_->embed.is_cuda())
    fail(error_code::unsupported, "batch-invariant attention is a CPU kernel; a model on " +
                                      impl_->embed.device().str() + " cannot run it");
  impl_->batch_invariant = on;
}

bool causal_lm::batch_invariant() const {
  return impl_->batch_invariant;
}

void causal_lm::set_gradient_checkpointing(bool on) {
  impl_->gradient_checkpointing = on;
}

bool causal_lm::gradient_checkpointing() const {
  return impl_->gradient_checkpointing;
}

void causal_lm::to(const c10::Device& device) {
  if (device.is_cuda() && impl_->batch_invariant)
    fail(error_code::unsupported, "batch-invariant attention is a CPU kernel; turn it off before "
                                  "moving the model to " + device.str());
  c10::NoGradGuard no_grad;
  std::unordered_set<const void*> moved; // TensorImpls already moved (tied and shared weights)
  auto move = [&](at::Tensor& t) {
    if (!t.defined() || !moved.insert(t.unsafeGetTensorImpl()).second)
      return;
    if (t.grad().defined())
      t.mutable_grad() = t.grad().to(device);
    if (t.device() != device)
      t.set_data(t.detach().to(device));
  };
  auto& p = *impl_;
  move(p.embed);
  move(p.final_norm);
  move(p.value_head);
  move(p.inv_freq);
  for (auto& l : p.layers)
    for (auto* t : {&l.input_norm, &l.post_attention_norm, &l.q_norm, &l.k_norm})
      move(*t);
  p.for_each_projection([&](projection& proj, const std::string&) {
    for (auto* t : {&proj.weight, &proj.bias, &proj.lora_a, &proj.lora_b})
      move(*t);
    proj.compute.reset();
  });
  for (auto& [name, t] : p.base)
    move(t);
}

void causal_lm::drop_compute_copies() {
  impl_->reset_compute_copies();
}

c10::Device causal_lm::device() const {
  return impl_->embed.device();
}

void causal_lm::store_weights_in_bf16() {
  if (has_lora())
    fail(error_code::invalid_argument,
         "store_weights_in_bf16: merge the LoRA adapters first (bf16 storage is for inference)");
  c10::NoGradGuard no_grad;
  impl_->compute = compute_dtype::bf16;
  impl_->reset_compute_copies();
  // Only the matrices the GEMMs (and the embedding lookup) read go to bf16; norms, biases and
  // the value head stay fp32, as in mixed-precision training.
  auto to_bf16 = [](at::Tensor& t) {
    if (!t.defined() || t.scalar_type() == at::kBFloat16)
      return;
    t.requires_grad_(false);
    t.set_data(t.detach().to(at::kBFloat16));
  };
  to_bf16(impl_->embed);
  impl_->for_each_projection([&](projection& p, const std::string&) {
    if (&p.weight != &impl_->embed)
      to_bf16(p.weight);
  });
  if (impl_->tied)
    impl_->head.weight = impl_->embed;
  for (auto& [name, t] : impl_->base)
    t.requires_grad_(false);
}

bool causal_lm::is_gemm_weight(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name == "model.embed_tokens.weight" || name == "lm_head.weight" ||
         (name.rfind("model.layers.", 0) == 0 && ends_with("_proj.weight"));
}

bool causal_lm::weights_in_bf16() const {
  return impl_->embed.scalar_type() == at::kBFloat16;
}

at::Tensor causal_lm::lm_head_compute_weight() const {
  auto w = impl_->compute_weight(impl_->head);
  return w.defined() ? w : impl_->head.weight;
}

int64_t causal_lm::compute_copy_bytes() const {
  int64_t n = 0;
  impl_->for_each_projection(
      [&](const projection& p, const std::string&) { n += p.compute.bytes(); });
  return n;
}

bool causal_lm::training() const {
  return impl_->training;
}

} // namespace rlforge::backends
