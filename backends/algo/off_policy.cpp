#include "backends/algo/off_policy.hpp"

#include <ATen/ATen.h>

#include <cmath>

#include "backends/error.hpp"

namespace rlforge::backends::algo {

namespace {

using detail::number_string;

double fraction(const at::Tensor& count, double denominator) {
  return count.to(at::kDouble).item<double>() / denominator;
}

void check_positive(const std::string& what, const std::string& key, double v) {
  if (!std::isfinite(v) || !(v > 0))
    fail(error_code::invalid_argument,
         what + ": '" + key + "' must be a finite number > 0, got " + number_string(v));
}

void check_non_negative(const std::string& what, const std::string& key, double v) {
  if (!std::isfinite(v) || v < 0)
    fail(error_code::invalid_argument,
         what + ": '" + key + "' must be a finite number >= 0, got " + number_string(v));
}

void check_order(const std::string& what, const std::string& low_key, double low,
                 const std::string& high_key, double high) {
  if (low > high)
    fail(error_code::invalid_argument, what + ": '" + low_key + "' (" + number_string(low) +
                                           ") exceeds '" + high_key + "' (" + number_string(high) +
                                           ")");
}

std::string option(const loss_config& cfg, const std::string& key, const std::string& fallback,
                   const std::vector<std::string>& valid, const std::string& what) {
  auto it = cfg.options.find(key);
  if (it == cfg.options.end())
    return fallback;
  for (const auto& v : valid)
    if (v == it->second)
      return v;
  fail(error_code::invalid_argument, what + ": '" + key + "' = '" + it->second +
                                         "' is not valid; valid values: " + detail::join(valid));
}

} // namespace

bool off_policy_config::enabled() const {
  return tis_ratio_type != "none" || sequence_mask_metric != "none" ||
         outlier_token_is_threshold_low || outlier_token_is_threshold_high ||
         token_mask_is_threshold_low || token_mask_is_threshold_high;
}

const std::vector<std::string>& off_policy_value_keys() {
  static const std::vector<std::string> keys = {
      "token_tis_ratio_clip_high",
      "sequence_tis_ratio_clip_high",
      "geo_mask_low",
      "geo_mask_high",
      "product_mask_low",
      "product_mask_high",
      "outlier_token_is_threshold_low",
      "outlier_token_is_threshold_high",
      "token_mask_is_threshold_low",
      "token_mask_is_threshold_high",
  };
  return keys;
}

const std::vector<std::string>& off_policy_option_keys() {
  static const std::vector<std::string> keys = {"tis_ratio_type", "sequence_mask_metric"};
  return keys;
}

off_policy_config parse_off_policy_config(const loss_config& cfg, const std::string& what) {
  off_policy_config out;
  out.tis_ratio_type = option(cfg, "tis_ratio_type", "none", {"none", "token", "sequence"}, what);
  out.sequence_mask_metric =
      option(cfg, "sequence_mask_metric", "none", {"none", "geometric", "product"}, what);
  auto get = [&](const char* key) -> std::optional<double> {
    auto it = cfg.values.find(key);
    if (it == cfg.values.end())
      return std::nullopt;
    return it->second;
  };
  if (auto v = get("token_tis_ratio_clip_high")) {
    check_positive(what, "token_tis_ratio_clip_high", *v);
    out.token_tis_ratio_clip_high = *v;
  }
  if (auto v = get("sequence_tis_ratio_clip_high")) {
    check_positive(what, "sequence_tis_ratio_clip_high", *v);
    out.sequence_tis_ratio_clip_high = *v;
  }
  for (auto [low_key, high_key, low, high] :
       {std::tuple{"geo_mask_low", "geo_mask_high", &out.geo_mask_low, &out.geo_mask_high},
        std::tuple{"product_mask_low", "product_mask_high", &out.product_mask_low,
                   &out.product_mask_high}}) {
    if (auto v = get(low_key)) {
      check_non_negative(what, low_key, *v);
      *low = *v;
    }
    if (auto v = get(high_key)) {
      check_positive(what, high_key, *v);
      *high = *v;
    }
    check_order(what, low_key, *low, high_key, *high);
  }
  if (auto v = get("outlier_token_is_threshold_low")) {
    check_non_negative(what, "outlier_token_is_threshold_low", *v);
    out.outlier_token_is_threshold_low = *v;
  }
  if (auto v = get("outlier_token_is_threshold_high")) {
    check_positive(what, "outlier_token_is_threshold_high", *v);
    out.outlier_token_is_threshold_high = *v;
  }
  if (out.outlier_token_is_threshold_low && out.outlier_token_is_threshold_high)
    check_order(what, "outlier_token_is_threshold_low", *out.outlier_token_is_threshold_low,
                "outlier_token_is_threshold_high", *out.outlier_token_is_threshold_high);
  if (auto v = get("token_mask_is_threshold_low")) {
    check_non_negative(what, "token_mask_is_threshold_low", *v);
    out.token_mask_is_threshold_low = *v;
  }
  if (auto v = get("token_mask_is_threshold_high")) {
    check_positive(what, "token_mask_is_threshold_high", *v);
    out.token_mask_is_threshold_high = *v;
  }
  if (out.token_mask_is_threshold_low && out.token_mask_is_threshold_high)
    check_order(what, "token_mask_is_threshold_low", *out.token_mask_is_threshold_low,
                "token_mask_is_threshold_high", *out.token_mask_is_threshold_high);
  return out;
}

off_policy_result compute_off_policy_correction(const at::Tensor& old_logprobs,
                                                const at::Tensor& rollout_logprobs,
                                                const at::Tensor& loss_mask,
                                                const off_policy_config& cfg) {
  const std::string what = "off-policy correction";
  detail::require_2d(old_logprobs, "old_logprobs", what);
  detail::require_2d(rollout_logprobs, "rollout_logprobs", what);
  detail::require_2d(loss_mask, "loss_mask", what);
  detail::require_shape(rollout_logprobs, "rollout_logprobs", old_logprobs.sizes(), "old_logprobs",
                        what);
  detail::require_shape(loss_mask, "loss_mask", old_logprobs.sizes(), "old_logprobs", what);
  detail::require_finite(old_logprobs, "old_logprobs", what);
  detail::require_finite(rollout_logprobs, "rollout_logprobs", what);
  detail::require_finite(loss_mask, "loss_mask", what);

  off_policy_result out;
  auto mask = loss_mask.detach().to(at::kFloat);
  out.loss_mask = mask;
  if (!cfg.enabled())
    return out;

  const auto log_ratio = (old_logprobs.detach() - rollout_logprobs.detach()).to(at::kFloat);
  const auto rho = log_ratio.clamp(-20.0, 20.0).exp();
  const double rows = static_cast<double>(mask.size(0));

  auto& m = out.metrics;
  const auto rho_masked = rho * mask;
  m["is_ratio_mean:mean"] = masked_mean(rho, mask).item<double>();
  m["is_ratio_std:mean"] = rho_masked.numel() > 1 ? rho_masked.std().item<double>() : 0.0;
  m["is_ratio_max:max"] = rho_masked.max().item<double>();
  m["is_ratio_min:min"] = rho_masked.min().item<double>();

  // 1. Outlier sequences: one bad valid token rejects its whole row.
  if (cfg.outlier_token_is_threshold_low || cfg.outlier_token_is_threshold_high) {
    auto valid = mask > 0;
    auto over = cfg.outlier_token_is_threshold_high
                    ? (rho > *cfg.outlier_token_is_threshold_high).logical_and(valid)
                    : at::zeros_like(valid);
    auto under = cfg.outlier_token_is_threshold_low
                     ? (rho < *cfg.outlier_token_is_threshold_low).logical_and(valid)
                     : at::zeros_like(valid);
    auto seq_over = over.any(-1);
    auto seq_under = under.any(-1);
    auto seq_bad = seq_over.logical_or(seq_under);
    m["outlier_seq_masked_ratio:mean"] = fraction(seq_bad.sum(), rows);
    m["outlier_seq_over_high_ratio:mean"] = fraction(seq_over.sum(), rows);
    m["outlier_seq_under_low_ratio:mean"] = fraction(seq_under.sum(), rows);
    mask = mask * seq_bad.logical_not().unsqueeze(-1).to(at::kFloat);
  }

  // 2. Per-token hard mask, closed interval.
  if (cfg.token_mask_is_threshold_low || cfg.token_mask_is_threshold_high) {
    auto in_bounds = at::ones_like(rho, rho.options().dtype(at::kBool));
    if (cfg.token_mask_is_threshold_low)
      in_bounds = in_bounds.logical_and(rho >= *cfg.token_mask_is_threshold_low);
    if (cfg.token_mask_is_threshold_high)
      in_bounds = in_bounds.logical_and(rho <= *cfg.token_mask_is_threshold_high);
    auto valid = mask > 0;
    auto masked = in_bounds.logical_not().logical_and(valid);
    m["token_mask_ratio:mean"] =
        masked.sum().item<double>() / std::max(1.0, valid.sum().item<double>());
    mask = mask * masked.logical_not().to(at::kFloat);
  }

  // 3. TIS on the mask as updated so far.
  if (cfg.tis_ratio_type == "token") {
    const double cap = cfg.token_tis_ratio_clip_high;
    auto valid = mask > 0;
    auto capped = (rho > cap).logical_and(valid);
    m["tis_token_clip_high_ratio:mean"] =
        capped.sum().item<double>() / std::max(1.0, valid.sum().item<double>());
    out.tis_ratio = rho.clamp_max(cap);
  } else if (cfg.tis_ratio_type == "sequence") {
    const double cap = cfg.sequence_tis_ratio_clip_high;
    auto seq = (log_ratio * mask).sum(-1, /*keepdim=*/true).clamp(-20.0, 20.0).exp();
    m["tis_seq_clip_high_ratio:mean"] = fraction((seq > cap).sum(), rows);
    out.tis_ratio = seq.clamp_max(cap);
  }

  // 4. Sequence mask.
  if (cfg.sequence_mask_metric != "none") {
    const bool geometric = cfg.sequence_mask_metric == "geometric";
    auto seq_log = (log_ratio * mask).sum(-1, /*keepdim=*/true);
    if (geometric)
      seq_log = seq_log / mask.sum(-1, /*keepdim=*/true).clamp_min(1.0);
    auto seq = seq_log.clamp(-20.0, 20.0).exp();
    const double low = geometric ? cfg.geo_mask_low : cfg.product_mask_low;
    const double high = geometric ? cfg.geo_mask_high : cfg.product_mask_high;
    auto over = seq > high;
    auto under = seq < low;
    auto rejected = over.logical_or(under);
    const std::string prefix = geometric ? "geo" : "product";
    m[prefix + "_sequence_mask_masked_ratio:mean"] = fraction(rejected.sum(), rows);
    m[prefix + "_sequence_mask_over_high_ratio:mean"] = fraction(over.sum(), rows);
    m[prefix + "_sequence_mask_under_low_ratio:mean"] = fraction(under.sum(), rows);
    mask = mask * rejected.logical_not().to(at::kFloat);
  }

  out.loss_mask = mask;
  return out;
}

} // namespace rlforge::backends::algo
