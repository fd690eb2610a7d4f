#include "backends/model/mixed_linear.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace rlforge::backends {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct mixed_linear_fn : torch::autograd::Function<mixed_linear_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& weight_bf16, const at::Tensor& bias) {
    const int64_t in = x.size(-1), out = weight_bf16.size(0);
    auto xb = x.reshape({-1, in}).to(at::kBFloat16);
    auto y = at::mm(xb, weight_bf16.t()).to(at::kFloat);
    if (bias.numel() > 0)
      y.add_(bias);
    auto shape = x.sizes().vec();
    shape.back() = out;
    ctx->save_for_backward({xb, weight_bf16});
    ctx->saved_data["x_float"] = x.scalar_type() == at::kFloat;
    return {y.view(shape)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& xb = saved[0];
    const auto& wb = saved[1];
    const int64_t out = wb.size(0);
    auto g = grads[0].reshape({-1, out});
    auto gb = g.to(at::kBFloat16);
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {
      auto shape = grads[0].sizes().vec();
      shape.back() = wb.size(1);
      grad_x = at::mm(gb, wb).view(shape);
      if (ctx->saved_data["x_float"].toBool())
        grad_x = grad_x.to(at::kFloat);
    }
    if (ctx->needs_input_grad(1))
      grad_w = at::mm(gb.t(), xb).to(at::kFloat);
    if (ctx->needs_input_grad(3))
      grad_b = g.sum(0);
    return {grad_x, grad_w, at::Tensor(), grad_b};
  }
};

} // namespace

at::Tensor mixed_linear(const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& weight_bf16, const at::Tensor& bias) {
  // Autograd functions take no undefined inputs: an empty tensor stands in for "no bias".
  static const at::Tensor none = at::empty({0});
  return mixed_linear_fn::apply(x, weight, weight_bf16, bias.defined() ? bias : none)[0];
}

const at::Tensor& bf16_copy::of(const at::Tensor& master) {
  if (master.scalar_type() == at::kBFloat16)
    return master;
  const void* data = master.data_ptr();
  const int64_t version = master._version();
  if (!copy_.defined() || data != data_ || version != version_) {
    c10::NoGradGuard no_grad;
    copy_ = master.detach().to(at::kBFloat16);
    data_ = data;
    version_ = version;
  }
  return copy_;
}

void bf16_copy::reset() {
  copy_ = at::Tensor();
  data_ = nullptr;
  version_ = -1;
}

int64_t bf16_copy::bytes() const {
  return copy_.defined() ? static_cast<int64_t>(copy_.nbytes()) : 0;
}

} // namespace rlforge::backends
