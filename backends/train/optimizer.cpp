#include "backends/train/optimizer.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <cmath>
#include <set>
#include <vector>
#include <sstream>

#include "backends/error.hpp"
#include "backends/train/detail.hpp"

namespace rlforge::backends {

namespace {

using detail::in_quotes;
using detail::number_text;
using detail::shape_text;

void check_field(const char* name, double value, bool ok, const char* domain) {
  if (std::isnan(value) || std::isinf(value) || !ok)
    fail(error_code::invalid_argument,
         std::string("adam_params.") + name + " = " + number_text(value) + " must be " + domain);
}

void check_moment(const std::string& name, const char* which, const at::Tensor& t) {
  if (!t.defined())
    fail(error_code::invalid_argument,
         "adamw state of " + in_quotes(name) + ": " + which + " is undefined");
  if (t.scalar_type() != at::kFloat)
    fail(error_code::invalid_argument, "adamw state of " + in_quotes(name) + ": " + which +
                                           " must be float32, got " +
                                           c10::toString(t.scalar_type()));
}

} // namespace

void validate(const adam_params& p) {
  check_field("learning_rate", p.learning_rate, p.learning_rate >= 0, "finite and >= 0");
  check_field("beta1", p.beta1, p.beta1 >= 0 && p.beta1 < 1, "in [0, 1)");
  check_field("beta2", p.beta2, p.beta2 >= 0 && p.beta2 < 1, "in [0, 1)");
  check_field("eps", p.eps, p.eps > 0, "finite and > 0");
  check_field("weight_decay", p.weight_decay, p.weight_decay >= 0, "finite and >= 0");
  check_field("grad_clip_norm", p.grad_clip_norm, p.grad_clip_norm >= 0,
              "finite and >= 0 (0 = no clipping)");
}

double global_grad_norm(const named_parameters& params) {
  double sum_sq = 0.0;
  std::vector<at::Tensor> on_device; // norms of gradients on a CUDA device, read back at once
  for (const auto& [name, p] : params) {
    if (!p.defined() || !p.grad().defined())
      continue;
    // Per-tensor norms in the gradient's own precision (no widened copy), summed in double.
    auto n = at::linalg_vector_norm(p.grad(), 2);
    if (n.is_cuda()) {
      on_device.push_back(n);
      continue;
    }
    double x = n.item<double>();
    sum_sq += x * x;
  }
  if (!on_device.empty())
    sum_sq += at::stack(on_device).to(at::kDouble).square().sum().item<double>();
  return std::sqrt(sum_sq);
}

void zero_grad(const named_parameters& params, bool set_to_none) {
  for (const auto& [name, p] : params) {
    if (!p.defined() || !p.grad().defined())
      continue;
    if (set_to_none) {
      p.mutable_grad() = at::Tensor();
    } else {
      c10::NoGradGuard no_grad;
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

step_result adamw::step(const named_parameters& params, const adam_params& hp) {
  validate(hp);
  // Check everything before touching anything, so a bad call changes nothing.
  std::set<std::string> names;
  for (const auto& [name, p] : params) {
    if (!names.insert(name).second)
      fail(error_code::invalid_argument, "adamw: parameter " + in_quotes(name) + " appears twice");
    if (!p.defined())
      fail(error_code::invalid_argument, "adamw: parameter " + in_quotes(name) + " is undefined");
    if (p.scalar_type() != at::kFloat)
      fail(error_code::invalid_argument, "adamw: parameter " + in_quotes(name) +
                                             " must be float32, got " +
                                             c10::toString(p.scalar_type()));
    const auto& g = p.grad();
    if (g.defined() && g.sizes() != p.sizes())
      fail(error_code::invalid_argument, "adamw: gradient of " + in_quotes(name) + " has shape " +
                                             shape_text(g.sizes()) + ", the parameter " +
                                             shape_text(p.sizes()));
    if (g.defined() && g.scalar_type() != at::kFloat)
      fail(error_code::invalid_argument, "adamw: gradient of " + in_quotes(name) +
                                             " must be float32, got " +
                                             c10::toString(g.scalar_type()));
    auto it = state_.find(name);
    if (it != state_.end() && it->second.exp_avg.sizes() != p.sizes())
      fail(error_code::invalid_argument,
           "adamw: parameter " + in_quotes(name) + " has shape " + shape_text(p.sizes()) +
               " but its optimizer state has shape " + shape_text(it->second.exp_avg.sizes()));
  }

  step_result result;
  result.grad_norm = global_grad_norm(params);
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    return result;
  }

  c10::NoGradGuard no_grad;
  if (hp.grad_clip_norm > 0) {
    double coef = hp.grad_clip_norm / (result.grad_norm + 1e-6);
    if (coef < 1.0) {
      result.clipped = true;
      for (const auto& [name, p] : params)
        if (p.grad().defined())
          p.mutable_grad().mul_(coef);
    }
  }

  const double lr = hp.learning_rate;
  for (const auto& [name, p] : params) {
    const auto& g = p.grad();
    if (!g.defined())
      continue;
    auto& s = state_[name];
    if (!s.exp_avg.defined()) {
      s.exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
      s.exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    s.step += 1;
    at::Tensor param = p;
    if (hp.weight_decay != 0)
      param.mul_(1 - lr * hp.weight_decay);
    const double bias1 = 1 - std::pow(hp.beta1, static_cast<double>(s.step));
    const double bias2 = 1 - std::pow(hp.beta2, static_cast<double>(s.step));
    s.exp_avg.mul_(hp.beta1).add_(g, 1 - hp.beta1);
    s.exp_avg_sq.mul_(hp.beta2).addcmul_(g, g, 1 - hp.beta2);
    // One temporary; the same operations and rounding as torch::optim::AdamW.
    auto denom = s.exp_avg_sq.sqrt().div_(std::sqrt(bias2)).add_(hp.eps);
    param.addcdiv_(s.exp_avg, denom, -lr / bias1);
  }
  last_params_ = hp;
  return result;
}

const adamw_param_state* adamw::state_of(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? nullptr : &it->second;
}

adamw_state adamw::state() const {
  adamw_state out;
  out.last_params = last_params_;
  for (const auto& [name, s] : state_)
    out.params[name] = adamw_param_state{s.exp_avg.clone(), s.exp_avg_sq.clone(), s.step};
  return out;
}

void validate(const adamw_state& s) {
  validate(s.last_params);
  for (const auto& [name, ps] : s.params) {
    check_moment(name, "exp_avg", ps.exp_avg);
    check_moment(name, "exp_avg_sq", ps.exp_avg_sq);
    if (ps.exp_avg.sizes() != ps.exp_avg_sq.sizes())
      fail(error_code::invalid_argument, "adamw state of " + in_quotes(name) +
                                             ": exp_avg has shape " +
                                             shape_text(ps.exp_avg.sizes()) + " but exp_avg_sq " +
                                             shape_text(ps.exp_avg_sq.sizes()));
    if (ps.step < 0)
      fail(error_code::invalid_argument, "adamw state of " + in_quotes(name) + ": step " +
                                             std::to_string(ps.step) + " is negative");
  }
}

void adamw::load_state(const adamw_state& s) {
  validate(s);
  std::map<std::string, adamw_param_state> fresh;
  for (const auto& [name, ps] : s.params)
    fresh[name] =
        adamw_param_state{ps.exp_avg.detach().clone(), ps.exp_avg_sq.detach().clone(), ps.step};
  state_ = std::move(fresh);
  last_params_ = s.last_params;
}

adamw_state adamw::take_state() {
  adamw_state out;
  out.params = std::move(state_);
  out.last_params = last_params_;
  reset();
  return out;
}

void adamw::put_state(adamw_state s) {
  validate(s);
  state_ = std::move(s.params);
  last_params_ = s.last_params;
}

void adamw::reset() {
  state_.clear();
  last_params_ = adam_params{};
}

} // namespace rlforge::backends
