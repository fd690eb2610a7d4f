#include "backends/algo/kl.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "backends/error.hpp"

namespace rlforge::backends::algo {

namespace {

using detail::number_string;

void check_pair(const at::Tensor& a, const std::string& a_name, const at::Tensor& b,
                const std::string& b_name, const std::string& what) {
  detail::require_2d(a, a_name, what);
  detail::require_2d(b, b_name, what);
  detail::require_shape(b, b_name, a.sizes(), a_name, what);
  detail::require_finite(a, a_name, what);
  detail::require_finite(b, b_name, what);
}

void check_mask(const at::Tensor& mask, const at::Tensor& ref, const std::string& ref_name,
                const std::string& what) {
  if (!mask.defined())
    return;
  detail::require_2d(mask, "loss_mask", what);
  detail::require_shape(mask, "loss_mask", ref.sizes(), ref_name, what);
  detail::require_finite(mask, "loss_mask", what);
}

void check_coef(double coef, const std::string& key, const std::string& what) {
  if (!std::isfinite(coef) || coef < 0)
    fail(error_code::invalid_argument,
         what + ": '" + key + "' must be a finite number >= 0, got " + number_string(coef));
}

} // namespace

const std::vector<std::string>& kl_estimator_names() {
  static const std::vector<std::string> names = {"k1", "k2", "k3", "abs"};
  return names;
}

at::Tensor approx_kl(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                     const std::string& estimator, const at::Tensor& loss_mask) {
  const std::string what = "approx_kl(" + estimator + ")";
  const auto& names = kl_estimator_names();
  if (std::find(names.begin(), names.end(), estimator) == names.end())
    fail(error_code::invalid_argument,
         "unknown KL estimator '" + estimator + "'; valid estimators: " + detail::join(names));
  check_pair(logprobs, "logprobs", ref_logprobs, "ref_logprobs", what);
  check_mask(loss_mask, logprobs, "logprobs", what);
  auto logp = logprobs.to(at::kFloat);
  auto ref = ref_logprobs.to(at::kFloat).detach();
  at::Tensor kl;
  if (estimator == "k1") {
    kl = logp - ref;
  } else if (estimator == "abs") {
    kl = (logp - ref).abs();
  } else if (estimator == "k2") {
    auto d = logp - ref;
    kl = 0.5 * d * d;
  } else {
    auto d = (ref - logp).clamp(-20.0, 20.0);
    kl = (d.exp() - d - 1.0).clamp(-10.0, 10.0);
  }
  if (loss_mask.defined()) {
    auto m = loss_mask.to(at::kFloat).detach();
    kl = at::where(m != 0, kl * m, at::zeros_like(kl));
  }
  return kl;
}

kl_loss_result kl_loss(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                       const at::Tensor& loss_mask, const std::string& estimator, double coef,
                       double rows) {
  check_coef(coef, "kl_loss_coef", "kl_loss");
  if (!std::isfinite(rows) || rows < 0)
    fail(error_code::invalid_argument, "kl_loss: rows must be finite and >= 0");
  auto kl = approx_kl(logprobs, ref_logprobs, estimator, loss_mask);
  auto m = loss_mask.defined() ? loss_mask.to(at::kFloat).detach() : at::ones_like(kl);
  kl_loss_result out;
  auto per_row = masked_row_mean(kl, m);
  out.kl = rows > 0 ? per_row.sum() / rows : per_row.mean();
  out.loss = coef * out.kl;
  return out;
}

at::Tensor entropy_bonus(const at::Tensor& entropy, const at::Tensor& loss_mask, double coef,
                         double tokens) {
  const std::string what = "entropy_bonus";
  check_coef(coef, "entropy_loss_coef", what);
  if (!std::isfinite(tokens) || tokens < 0)
    fail(error_code::invalid_argument, what + ": tokens must be finite and >= 0");
  detail::require_2d(entropy, "entropy", what);
  detail::require_finite(entropy, "entropy", what);
  check_mask(loss_mask, entropy, "entropy", what);
  auto e = entropy.to(at::kFloat);
  auto m = loss_mask.defined() ? loss_mask.to(at::kFloat).detach() : at::Tensor();
  if (tokens > 0)
    return coef * (m.defined() ? (e * m).sum() : e.sum()) / tokens;
  return coef * masked_mean(e, m);
}

void apply_regularizers(loss_output& out, const loss_inputs& in, const regularizer_config& cfg) {
  const std::string what = "apply_regularizers";
  if (!out.loss.defined())
    fail(error_code::invalid_argument, what + ": the loss output has no loss");
  if (cfg.use_kl_loss) {
    if (!in.logprobs.defined())
      fail(error_code::invalid_argument, what + ": the KL loss needs input 'logprobs'");
    if (!in.ref_logprobs.defined())
      fail(error_code::invalid_argument, what + ": the KL loss needs input 'ref_logprobs'");
    auto kl = kl_loss(in.logprobs, in.ref_logprobs, in.loss_mask, cfg.kl_estimator,
                      cfg.kl_loss_coef, cfg.pass_rows);
    out.loss = out.loss + kl.loss;
    out.metrics["kl:mean"] = kl.kl.item<double>();
    out.metrics["kl_loss:mean"] = kl.loss.item<double>();
  }
  if (cfg.use_entropy_loss) {
    if (!in.entropy.defined())
      fail(error_code::invalid_argument, what + ": the entropy bonus needs input 'entropy'");
    auto bonus = entropy_bonus(in.entropy, in.loss_mask, cfg.entropy_loss_coef, cfg.pass_tokens);
    out.loss = out.loss - bonus;
    out.metrics["entropy_loss:mean"] = bonus.item<double>();
  }
  if (cfg.use_kl_loss || cfg.use_entropy_loss)
    out.metrics["total_loss:sum"] = out.loss.item<double>();
}

kl_controller kl_controller::fixed(double coef) {
  if (!std::isfinite(coef))
    fail(error_code::invalid_argument,
         "kl_controller: 'kl_loss_coef' must be finite, got " + number_string(coef));
  return kl_controller(coef, false, 0.0, 0);
}

kl_controller kl_controller::adaptive(double init_coef, double target, int64_t horizon) {
  if (!std::isfinite(init_coef))
    fail(error_code::invalid_argument,
         "kl_controller: 'kl_loss_coef' must be finite, got " + number_string(init_coef));
  if (!std::isfinite(target) || !(target > 0))
    fail(error_code::invalid_argument,
         "kl_controller: 'kl_target' must be a finite number > 0, got " + number_string(target));
  if (horizon <= 0)
    fail(error_code::invalid_argument,
         "kl_controller: 'horizon' must be > 0, got " + std::to_string(horizon));
  return kl_controller(init_coef, true, target, horizon);
}

void kl_controller::update(double current_kl, int64_t n_steps) {
  if (!std::isfinite(current_kl))
    fail(error_code::invalid_argument,
         "kl_controller::update: current KL must be finite, got " + number_string(current_kl));
  if (n_steps < 0)
    fail(error_code::invalid_argument,
         "kl_controller::update: n_steps must be >= 0, got " + std::to_string(n_steps));
  if (!adaptive_)
    return;
  const double error = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * static_cast<double>(n_steps) / static_cast<double>(horizon_);
}

kl_reward_result apply_kl_to_rewards(const at::Tensor& rewards, const at::Tensor& logprobs,
                                     const at::Tensor& ref_logprobs, const at::Tensor& loss_mask,
                                     kl_controller& controller, const std::string& estimator) {
  const std::string what = "apply_kl_to_rewards";
  detail::require_2d(rewards, "rewards", what);
  detail::require_finite(rewards, "rewards", what);
  detail::require_2d(logprobs, "logprobs", what);
  detail::require_shape(logprobs, "logprobs", rewards.sizes(), "rewards", what);
  auto kl = approx_kl(logprobs.detach(), ref_logprobs.detach(), estimator, loss_mask);
  auto m = loss_mask.defined() ? loss_mask.to(at::kFloat).detach() : at::ones_like(kl);
  kl_reward_result out;
  out.coef = std::max(0.0, controller.value());
  out.rewards = rewards.to(at::kFloat) - kl * out.coef;
  out.avg_kl = masked_row_mean(kl, m).mean().item<double>();
  out.avg_kl_max = std::get<0>(kl.abs().max(-1)).mean().item<double>();
  controller.update(out.avg_kl, rewards.size(0));
  return out;
}

} // namespace rlforge::backends::algo
