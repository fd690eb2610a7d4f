#include "backends/algo/losses.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>

#include "backends/algo/off_policy.hpp"
#include "backends/error.hpp"

namespace rlforge::backends::algo {

namespace {

using detail::number_string;

// Inputs after conversion to fp32; `mask` is always defined. Targets and behaviour log-probs are
// detached: only `logp` and `values` carry gradients. `metric_mask` selects the tokens the
// metrics average over (see `metric_mask_of`).
struct prepared {
  at::Tensor logp, old, roll, adv, mask, values, old_values, returns, entropy, metric_mask;
};

struct context {
  const std::string& what;
  const prepared& in;
  const loss_config& cfg;
  std::map<std::string, double>& metrics;

  double get(const std::string& key, double fallback) const {
    auto it = cfg.values.find(key);
    return it == cfg.values.end() ? fallback : it->second;
  }
  std::string option(const std::string& key, const std::string& fallback) const {
    auto it = cfg.options.find(key);
    return it == cfg.options.end() ? fallback : it->second;
  }
};

// A loss body: returns the per-token loss ℓ [B, R] (not yet masked) and fills metrics.
using loss_body = std::function<at::Tensor(const context&)>;

struct loss_entry {
  bool value_loss = false;
  bool off_policy = false;                  // the off-policy correction block applies
  std::map<std::string, double> value_keys; // own numeric keys → default (NaN = required)
  std::map<std::string, std::vector<std::string>> option_keys; // own string keys → valid values
  loss_body body;
};

constexpr double required = std::numeric_limits<double>::quiet_NaN();

constexpr const char* old_logprobs_option = "old_logprobs";

/// True when `cfg` takes the old log-probs from the current policy (option old_logprobs =
/// current; validated).
bool old_is_current(const loss_config& cfg) {
  auto it = cfg.options.find(old_logprobs_option);
  return it != cfg.options.end() && it->second == "current";
}

at::Tensor ratio(const at::Tensor& logp, const at::Tensor& base) {
  return (logp - base).clamp(-20.0, 20.0).exp();
}

/// The tokens the `:mean` metrics average over, by |loss-mask weight|: the loss mask's nonzero
/// positions, narrowed to `given`'s nonzero ones when that is defined and leaves any.
at::Tensor metric_mask_of(const prepared& p, const at::Tensor& given) {
  auto weight = p.mask.abs();
  if (!given.defined())
    return weight;
  auto m = weight * (given != 0).to(at::kFloat);
  return m.sum().item<double>() > 0 ? m : weight;
}

double mean_metric(const at::Tensor& indicator, const at::Tensor& mask) {
  return masked_mean(indicator.to(at::kFloat), mask).item<double>();
}

// The PPO clipped surrogate on ratio `r` (shared by regular, dual_clip, gspo).
at::Tensor ppo_surrogate(const context& c, const at::Tensor& r) {
  const auto& a = c.in.adv;
  auto surr1 = r * a;
  auto surr2 = r.clamp(1.0 - c.get("eps_clip_low", 0.2), 1.0 + c.get("eps_clip_high", 0.2)) * a;
  c.metrics["clip_ratio:mean"] = mean_metric(surr2.detach() < surr1.detach(), c.in.metric_mask);
  return -at::minimum(surr1, surr2);
}

at::Tensor regular_body(const context& c) {
  return ppo_surrogate(c, ratio(c.in.logp, c.in.old));
}

at::Tensor dual_clip_body(const context& c) {
  auto l = ppo_surrogate(c, ratio(c.in.logp, c.in.old));
  const double cap = c.get("clip_ratio_c", 3.0);
  return at::where(c.in.adv < 0, at::minimum(-c.in.adv * cap, l), l);
}

at::Tensor gspo_body(const context& c) {
  const auto& logp = c.in.logp;
  auto seq_log_ratio = masked_row_mean(logp.detach() - c.in.old, c.in.mask).unsqueeze(-1);
  auto log_w = (logp - logp.detach() + seq_log_ratio).clamp_max(10.0);
  return ppo_surrogate(c, log_w.exp());
}

at::Tensor sapo_body(const context& c) {
  const double tau_pos = c.get("tau_pos", 1.0);
  const double tau_neg = c.get("tau_neg", 1.05);
  const auto& a = c.in.adv;
  auto r = ratio(c.in.logp, c.in.old);
  auto tau = at::where(a > 0, at::full_like(a, tau_pos), at::full_like(a, tau_neg));
  auto gate = at::sigmoid(tau * (r - 1.0)) * (4.0 / tau);
  c.metrics["clip_ratio:mean"] = 0.0;
  return -gate * a;
}

at::Tensor cispo_body(const context& c) {
  const double lo = 1.0 - c.get("cispo_eps_clip_low", 1.0);
  const double hi = 1.0 + c.get("cispo_eps_clip_high", 4.0);
  const bool rollout = c.option("cispo_anchor", "old") == "rollout";
  auto r = ratio(c.in.logp, rollout ? c.in.roll : c.in.old);
  auto clamped = r.clamp(lo, hi);
  const auto& m = c.in.metric_mask;
  auto rd = r.detach();
  c.metrics["clip_ratio:mean"] = mean_metric((rd < lo).logical_or(rd > hi), m);
  c.metrics["cispo_ratio_mean:mean"] = masked_mean(rd, m).item<double>();
  c.metrics["cispo_ratio_clamped_mean:mean"] = masked_mean(clamped.detach(), m).item<double>();
  auto valid = m > 0;
  auto active = valid.any().item<bool>() ? rd.masked_select(valid) : rd.flatten();
  if (active.numel() > 0) {
    c.metrics["cispo_ratio_max:max"] = active.max().item<double>();
    c.metrics["cispo_ratio_min:min"] = active.min().item<double>();
  }
  return -c.in.adv * clamped.detach() * c.in.logp;
}

at::Tensor rollout_is_body(const context& c) {
  auto r = ratio(c.in.logp, c.in.roll).detach();
  auto in_range =
      (r > 1.0 - c.get("eps_clip_low", 0.2)).logical_and(r < 1.0 + c.get("eps_clip_high", 0.2));
  auto calibrated = at::where(in_range, r, at::zeros_like(r));
  c.metrics["clip_ratio:mean"] = mean_metric(in_range.logical_not(), c.in.metric_mask);
  return -(calibrated * c.in.adv * c.in.logp);
}

at::Tensor dppo_body(const context& c) {
  const auto& mu = c.in.roll.defined() ? c.in.roll : c.in.old;
  const auto& a = c.in.adv;
  const double delta_low = c.get("delta_low", 0.2);
  const double delta_high = c.get("delta_high", 0.2);
  auto r = ratio(c.in.logp, mu);
  auto logp = c.in.logp.detach();
  auto p = logp.exp();
  auto mu_p = mu.exp();
  auto diff = p - mu_p;
  at::Tensor drop;
  if (c.option("dppo_type", "binary_tv") == "binary_tv") {
    drop =
        (a > 0).logical_and(diff > delta_high).logical_or((a < 0).logical_and(-diff > delta_low));
  } else {
    constexpr double eps = 1e-8;
    auto kl = mu_p * (mu - logp) + (1.0 - mu_p) * at::log((1.0 - mu_p + eps) / (1.0 - p + eps));
    drop = (a > 0)
               .logical_and(diff > 0)
               .logical_and(kl > delta_high)
               .logical_or((a < 0).logical_and(diff < 0).logical_and(kl > delta_low));
  }
  auto keep = drop.logical_not().to(at::kFloat);
  c.metrics["clip_ratio:mean"] = mean_metric(drop, c.in.metric_mask);
  return -(r * a * keep);
}

// Covariance of advantage and log-prob per token, centred on the means over valid tokens.
at::Tensor token_covariance(const prepared& in) {
  auto logp = in.logp.detach();
  return (in.adv - masked_mean(in.adv, in.mask)) * (logp - masked_mean(logp, in.mask));
}

at::Tensor clip_cov_body(const context& c) {
  const auto& a = c.in.adv;
  const auto& m = c.in.mask;
  auto r = ratio(c.in.logp, c.in.old);
  auto pg1 = -a * r;
  auto pg2 = -a * r.clamp(1.0 - c.get("eps_clip_low", 0.2), 1.0 + c.get("eps_clip_high", 0.2));
  auto valid = m > 0;
  auto clipped_by_ppo = (pg2.detach() > pg1.detach()).logical_and(valid);
  auto cov = token_covariance(c.in);
  auto candidates = (cov > c.get("clip_cov_lb", 1.0))
                        .logical_and(cov < c.get("clip_cov_ub", 5.0))
                        .logical_and(valid)
                        .logical_and(clipped_by_ppo.logical_not());
  const double budget = std::floor(c.get("clip_ratio", 2e-4) * m.sum().item<double>());
  const int64_t clip_num = std::max<int64_t>(static_cast<int64_t>(budget), 1);
  auto idx = at::nonzero(candidates); // [K, 2], row-major order
  auto corr = at::ones_like(a);
  const int64_t k = idx.size(0);
  if (k > 0) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.get("seed", 0.0)));
    auto perm = at::randperm(k, gen, at::TensorOptions().dtype(at::kLong)).to(idx.device());
    auto chosen = idx.index_select(0, perm.narrow(0, 0, std::min(clip_num, k)));
    corr.index_put_({chosen.select(1, 0), chosen.select(1, 1)}, at::zeros({}, corr.options()));
  }
  c.metrics["clip_ratio:mean"] = mean_metric(corr == 0, c.in.metric_mask);
  return at::maximum(pg1, pg2) * corr;
}

at::Tensor kl_cov_body(const context& c) {
  const auto& a = c.in.adv;
  const auto& m = c.in.mask;
  auto r = ratio(c.in.logp, c.in.old);
  auto pg = -a * r;
  auto pg_kl = pg + c.get("ppo_kl_coef", 1.0) * (c.in.logp - c.in.old).abs();
  auto valid_flat = (m > 0).flatten();
  auto valid_idx = at::nonzero(valid_flat).squeeze(-1);
  const int64_t n = valid_idx.size(0);
  auto selected = at::zeros_like(valid_flat);
  if (n > 0) {
    auto adv_v = a.flatten().index_select(0, valid_idx);
    auto logp_v = c.in.logp.detach().flatten().index_select(0, valid_idx);
    auto cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean());
    const double frac_count = std::floor(static_cast<double>(n) * c.get("kl_cov_frac", 0.2));
    const int64_t k = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(frac_count), 1), n);
    auto top = std::get<1>(cov.topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/true));
    selected.index_fill_(0, valid_idx.index_select(0, top), true);
  }
  c.metrics["clip_ratio:mean"] = 0.0;
  return at::where(selected.view(a.sizes()), pg_kl, pg);
}

at::Tensor cross_entropy_body(const context& c) {
  return -c.in.logp;
}

at::Tensor importance_sampling_body(const context& c) {
  auto r = ratio(c.in.logp, c.in.old);
  c.metrics["importance_ratio:mean"] = masked_mean(r.detach(), c.in.metric_mask).item<double>();
  return -(r * c.in.adv);
}

at::Tensor dro_body(const context& c) {
  const double beta = c.get("beta", 0.0);
  auto d = c.in.logp - c.in.old;
  return -(c.in.logp * c.in.adv - 0.5 * beta * d * d);
}

bool critic_clipping(const loss_config& cfg) {
  auto opt = cfg.options.find("value_clip");
  if (opt != cfg.options.end())
    return false; // validated to be "none"
  auto it = cfg.values.find("value_clip");
  return it == cfg.values.end() || std::isfinite(it->second);
}

at::Tensor ppo_critic_body(const context& c) {
  const auto& v = c.in.values;
  const auto& ret = c.in.returns;
  auto err = v - ret;
  auto unclipped = err * err;
  if (!critic_clipping(c.cfg))
    return 0.5 * unclipped;
  const double vc = c.get("value_clip", 0.2);
  auto v_clipped = c.in.old_values + (v - c.in.old_values).clamp(-vc, vc);
  auto cerr = v_clipped - ret;
  auto clipped = cerr * cerr;
  c.metrics["clipfrac:mean"] = mean_metric(clipped.detach() > unclipped.detach(), c.in.mask);
  return 0.5 * at::maximum(clipped, unclipped);
}

const std::map<std::string, loss_entry>& registry() {
  static const std::map<std::string, loss_entry> entries = [] {
    const std::map<std::string, double> ppo_keys = {{"eps_clip_low", 0.2}, {"eps_clip_high", 0.2}};
    // Where the losses that read the old policy's log-probs take them from.
    const std::map<std::string, std::vector<std::string>> old_source = {
        {old_logprobs_option, {"given", "current"}}};
    std::map<std::string, loss_entry> e;
    e["cross_entropy"] = {false, false, {}, {}, cross_entropy_body};
    e["importance_sampling"] = {false, false, {}, old_source, importance_sampling_body};
    e["regular"] = {false, true, ppo_keys, old_source, regular_body};
    auto dual = ppo_keys;
    dual["clip_ratio_c"] = 3.0;
    e["dual_clip"] = {false, true, dual, old_source, dual_clip_body};
    e["gspo"] = {false, true, ppo_keys, old_source, gspo_body};
    e["sapo"] = {false, true, {{"tau_pos", 1.0}, {"tau_neg", 1.05}}, old_source, sapo_body};
    auto cispo_options = old_source;
    cispo_options["cispo_anchor"] = {"old", "rollout"};
    e["cispo"] = {false,
                  true,
                  {{"cispo_eps_clip_low", 1.0}, {"cispo_eps_clip_high", 4.0}},
                  cispo_options,
                  cispo_body};
    e["rollout_is"] = {false, true, ppo_keys, {}, rollout_is_body};
    e["dppo"] = {false,
                 true,
                 {{"delta_low", 0.2}, {"delta_high", 0.2}},
                 {{"dppo_type", {"binary_tv", "binary_kl"}}},
                 dppo_body};
    auto clip_cov = ppo_keys;
    clip_cov.insert(
        {{"clip_ratio", 2e-4}, {"clip_cov_lb", 1.0}, {"clip_cov_ub", 5.0}, {"seed", 0.0}});
    e["clip_cov"] = {false, false, clip_cov, old_source, clip_cov_body};
    e["kl_cov"] = {
        false, false, {{"kl_cov_frac", 0.2}, {"ppo_kl_coef", 1.0}}, old_source, kl_cov_body};
    e["dro"] = {false, false, {{"beta", required}}, old_source, dro_body};
    e["ppo_critic"] = {
        true, false, {{"value_clip", 0.2}}, {{"value_clip", {"none"}}}, ppo_critic_body};
    return e;
  }();
  return entries;
}

const loss_entry& find_entry(const std::string& name) {
  const auto& r = registry();
  auto it = r.find(name);
  if (it == r.end()) {
    std::vector<std::string> all = policy_loss_names();
    all.insert(all.end(), value_loss_names().begin(), value_loss_names().end());
    fail(error_code::invalid_argument,
         "unknown loss '" + name + "'; valid losses: " + detail::join(all));
  }
  return it->second;
}

std::string what_of(const std::string& name) {
  return "compute_loss(" + name + ")";
}

void check_domain(const std::string& what, const std::string& key, double v) {
  auto bad = [&](const std::string& domain) {
    fail(error_code::invalid_argument,
         what + ": '" + key + "' must be " + domain + ", got " + number_string(v));
  };
  if (std::isnan(v))
    bad("a number");
  if (key == "clip_ratio_c") {
    if (!std::isfinite(v) || !(v > 1.0))
      bad("a finite number > 1");
  } else if (key == "tau_pos" || key == "tau_neg") {
    if (!std::isfinite(v) || !(v > 0.0))
      bad("a finite number > 0");
  } else if (key == "clip_ratio" || key == "kl_cov_frac") {
    if (!(v >= 0.0 && v <= 1.0))
      bad("in [0, 1]");
  } else if (key == "clip_cov_lb" || key == "clip_cov_ub") {
    if (!std::isfinite(v))
      bad("finite");
  } else if (key == "seed") {
    if (!(v >= 0.0 && v <= 9007199254740992.0) || std::floor(v) != v)
      bad("an integer in [0, 2^53]");
  } else if (key == "value_clip") {
    if (v < 0.0)
      bad("a number >= 0 (inf disables clipping)");
  } else { // eps_*, cispo_eps_*, delta_*, ppo_kl_coef, beta
    if (!std::isfinite(v) || v < 0.0)
      bad("a finite number >= 0");
  }
}

std::string key_list(const loss_entry& e) {
  std::vector<std::string> values, options;
  for (const auto& [k, d] : e.value_keys)
    values.push_back(k);
  for (const auto& [k, vs] : e.option_keys)
    options.push_back(k);
  if (e.off_policy) {
    values.insert(values.end(), off_policy_value_keys().begin(), off_policy_value_keys().end());
    options.insert(options.end(), off_policy_option_keys().begin(), off_policy_option_keys().end());
  }
  std::sort(values.begin(), values.end());
  std::sort(options.begin(), options.end());
  return "valid keys: " + detail::join(values) + "; valid options: " + detail::join(options);
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Validates and returns the parsed off-policy settings (all off for losses without the block).
off_policy_config validate(const std::string& name, const loss_entry& e, const loss_config& cfg) {
  const auto what = what_of(name);
  for (const auto& [key, v] : cfg.values) {
    const bool own = e.value_keys.count(key) > 0;
    const bool op = e.off_policy && contains(off_policy_value_keys(), key);
    if (!own && !op)
      fail(error_code::invalid_argument,
           what + ": unknown config key '" + key + "'; " + key_list(e));
    if (own)
      check_domain(what, key, v);
  }
  for (const auto& [key, v] : cfg.options) {
    auto own = e.option_keys.find(key);
    const bool op = e.off_policy && contains(off_policy_option_keys(), key);
    if (own == e.option_keys.end() && !op)
      fail(error_code::invalid_argument, what + ": unknown option '" + key + "'; " + key_list(e));
    if (own != e.option_keys.end() && !contains(own->second, v))
      fail(error_code::invalid_argument,
           what + ": option '" + key + "' = '" + v +
               "' is not valid; valid values: " + detail::join(own->second));
  }
  for (const auto& [key, def] : e.value_keys)
    if (std::isnan(def) && !cfg.values.count(key))
      fail(error_code::invalid_argument,
           what + ": missing required config key '" + key + "'; " + key_list(e));
  if (cfg.values.count("value_clip") && cfg.options.count("value_clip"))
    fail(error_code::invalid_argument,
         what + ": 'value_clip' given both as a number and as the option 'none'");
  auto lb = cfg.values.find("clip_cov_lb");
  auto ub = cfg.values.find("clip_cov_ub");
  const double lbv = lb == cfg.values.end() ? 1.0 : lb->second;
  const double ubv = ub == cfg.values.end() ? 5.0 : ub->second;
  if (name == "clip_cov" && lbv > ubv)
    fail(error_code::invalid_argument, what + ": 'clip_cov_lb' (" + number_string(lbv) +
                                           ") exceeds 'clip_cov_ub' (" + number_string(ubv) + ")");
  off_policy_config op;
  if (e.off_policy)
    op = parse_off_policy_config(cfg, what);
  if (name == "cispo") {
    auto anchor = cfg.options.find("cispo_anchor");
    const bool rollout = anchor != cfg.options.end() && anchor->second == "rollout";
    if (rollout && op.tis_ratio_type != "none")
      fail(error_code::invalid_argument,
           what +
               ": cispo_anchor 'rollout' already corrects against the rollout policy; "
               "tis_ratio_type '" +
               op.tis_ratio_type + "' would apply the correction twice (set it to 'none')");
    if (rollout && old_is_current(cfg))
      fail(error_code::invalid_argument,
           what + ": with cispo_anchor 'rollout' the loss reads no old log-probs, so option "
                  "'old_logprobs' = 'current' would do nothing (leave it out)");
  }
  return op;
}

at::Tensor to_float(const at::Tensor& t, bool keep_grad) {
  if (!t.defined())
    return t;
  auto f = t.to(at::kFloat);
  return keep_grad ? f : f.detach();
}

} // namespace

const std::vector<std::string>& policy_loss_names() {
  static const std::vector<std::string> names = {
      "cross_entropy", "importance_sampling", "regular", "dual_clip", "gspo",   "sapo",
      "cispo",         "rollout_is",          "dppo",    "clip_cov",  "kl_cov", "dro",
  };
  return names;
}

const std::vector<std::string>& value_loss_names() {
  static const std::vector<std::string> names = {"ppo_critic"};
  return names;
}

bool is_value_loss(const std::string& name) {
  return contains(value_loss_names(), name);
}

bool is_loss_name(const std::string& name) {
  return registry().count(name) > 0;
}

std::vector<std::string> loss_value_keys(const std::string& name) {
  const auto& e = find_entry(name);
  std::vector<std::string> keys;
  for (const auto& [k, d] : e.value_keys)
    keys.push_back(k);
  if (e.off_policy)
    keys.insert(keys.end(), off_policy_value_keys().begin(), off_policy_value_keys().end());
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<std::string> loss_option_keys(const std::string& name) {
  const auto& e = find_entry(name);
  std::vector<std::string> keys;
  for (const auto& [k, vs] : e.option_keys)
    keys.push_back(k);
  if (e.off_policy)
    keys.insert(keys.end(), off_policy_option_keys().begin(), off_policy_option_keys().end());
  std::sort(keys.begin(), keys.end());
  return keys;
}

void validate_loss_config(const std::string& name, const loss_config& cfg) {
  (void)check_loss(name, cfg);
}

checked_loss check_loss(const std::string& name, const loss_config& cfg) {
  return checked_loss{name, cfg, validate(name, find_entry(name), cfg)};
}

struct checked_loss_access {
  static const off_policy_config& off_policy(const checked_loss& l) { return l.off_policy_; }
};

checked_loss accept_checked_loss(const std::string& name, const loss_config& cfg) {
#ifndef NDEBUG
  try {
    return check_loss(name, cfg);
  } catch (const error& e) {
    fail(error_code::internal,
         std::string{"a loss accepted as checked does not pass check_loss: "} + e.what());
  }
#else
  const auto& entry = find_entry(name);
  off_policy_config op;
  if (entry.off_policy)
    op = parse_off_policy_config(cfg, what_of(name));
  return checked_loss{name, cfg, std::move(op)};
#endif
}

namespace {

/// What `check_inputs` checks: everything `compute_loss` reads, or a request's inputs before
/// the model computed its outputs (logprobs, values, entropy).
enum class input_set { everything, before_outputs };

/// The input checks of `compute_loss` (config `cfg` already validated into `op`).
void check_inputs(const std::string& name, const loss_entry& entry, const off_policy_config& op,
                  const loss_inputs& in, const loss_config& cfg,
                  input_set which = input_set::everything) {
  const auto what = what_of(name);
  const bool outputs = which == input_set::everything;

  // Which inputs this loss needs.
  std::vector<std::pair<std::string, const at::Tensor*>> need;
  const bool op_active = entry.off_policy && op.enabled() && in.rollout_logprobs.defined();
  if (entry.value_loss) {
    need = {{"values", &in.values}, {"returns", &in.returns}};
    if (critic_clipping(cfg))
      need.push_back({"old_values", &in.old_values});
  } else {
    need = {{"logprobs", &in.logprobs}};
    if (name != "cross_entropy")
      need.push_back({"advantages", &in.advantages});
    const bool cispo_rollout = name == "cispo" && cfg.options.count("cispo_anchor") &&
                               cfg.options.at("cispo_anchor") == "rollout";
    if (name == "rollout_is" || cispo_rollout)
      need.push_back({"rollout_logprobs", &in.rollout_logprobs});
    const bool needs_old =
        name != "cross_entropy" && name != "rollout_is" && name != "dppo" && !cispo_rollout;
    if (old_is_current(cfg)) {
      if (in.old_logprobs.defined())
        fail(error_code::invalid_argument,
             what + ": option 'old_logprobs' = 'current' takes the old log-probs from the "
                    "current policy, so the input 'old_logprobs' must be absent (give one or "
                    "the other)");
    } else if (needs_old || op_active) {
      need.push_back({"old_logprobs", &in.old_logprobs});
    }
    if (name == "dppo" && !in.rollout_logprobs.defined() && !in.old_logprobs.defined())
      fail(error_code::invalid_argument,
           what + ": missing input 'rollout_logprobs' (or, failing that, 'old_logprobs')");
  }
  for (const auto& [input, t] : need)
    if (!t->defined() && (outputs || (input != "logprobs" && input != "values")))
      fail(error_code::invalid_argument, what + ": missing input '" + input + "'");

  // Shapes and values of every tensor given: like the model's output, or before it exists,
  // like the loss mask.
  if (!outputs && !in.loss_mask.defined())
    fail(error_code::internal, what + ": a request's inputs are checked against its loss mask, "
                                      "which is missing");
  const std::string ref_name = !outputs ? "loss_mask" : entry.value_loss ? "values" : "logprobs";
  const at::Tensor& ref = !outputs ? in.loss_mask : entry.value_loss ? in.values : in.logprobs;
  detail::require_2d(ref, ref_name, what);
  const std::vector<std::pair<std::string, const at::Tensor*>> all = {
      {"logprobs", &in.logprobs},
      {"old_logprobs", &in.old_logprobs},
      {"rollout_logprobs", &in.rollout_logprobs},
      {"advantages", &in.advantages},
      {"loss_mask", &in.loss_mask},
      {"values", &in.values},
      {"old_values", &in.old_values},
      {"returns", &in.returns},
      {"ref_logprobs", &in.ref_logprobs},
      {"entropy", &in.entropy},
      {"metric_mask", &in.metric_mask},
  };
  for (const auto& [input, t] : all) {
    if (!t->defined())
      continue;
    if (!t->is_floating_point())
      fail(error_code::invalid_argument, what + ": '" + input +
                                             "' must be a floating-point tensor, got " +
                                             std::string(c10::toString(t->scalar_type())));
    detail::require_shape(*t, input, ref.sizes(), ref_name, what);
    detail::require_finite(*t, input, what);
  }
}

} // namespace

void check_loss_inputs(const std::string& name, const loss_inputs& in, const loss_config& cfg) {
  const auto& entry = find_entry(name);
  check_inputs(name, entry, validate(name, entry, cfg), in, cfg);
}

void check_request_inputs(const checked_loss& loss, const loss_inputs& in) {
  auto given = in;
  given.logprobs = given.values = given.entropy = at::Tensor{};
  check_inputs(loss.name(), find_entry(loss.name()), checked_loss_access::off_policy(loss), given,
               loss.config(), input_set::before_outputs);
}

loss_output compute_loss(const std::string& name, const loss_inputs& in, const loss_config& cfg) {
  auto loss = check_loss(name, cfg);
  check_inputs(name, find_entry(name), checked_loss_access::off_policy(loss), in, cfg);
  return compute_loss(loss, in);
}

loss_output compute_loss(const checked_loss& loss, const loss_inputs& in) {
  const auto& name = loss.name();
  const auto& cfg = loss.config();
  const auto& entry = find_entry(name);
  const auto& op = checked_loss_access::off_policy(loss);
#ifndef NDEBUG
  try {
    check_inputs(name, entry, op, in, cfg);
  } catch (const error& e) {
    fail(error_code::internal,
         std::string{"compute_loss on inputs that were not checked with their request: "} +
             e.what());
  }
#endif
  const auto what = what_of(name);
  const bool op_active = entry.off_policy && op.enabled() && in.rollout_logprobs.defined();
  const at::Tensor& ref = entry.value_loss ? in.values : in.logprobs;

  prepared p;
  p.logp = to_float(in.logprobs, true);
  // The current policy as the old one: the ratio is exactly 1 and only its gradient is left,
  // which is what a separate forward of the same weights would give.
  p.old = old_is_current(cfg) ? p.logp.detach() : to_float(in.old_logprobs, false);
  p.roll = to_float(in.rollout_logprobs, false);
  p.adv = to_float(in.advantages, false);
  p.mask = in.loss_mask.defined() ? to_float(in.loss_mask, false)
                                  : at::ones(ref.sizes(), ref.options().dtype(at::kFloat));
  p.values = to_float(in.values, true);
  p.old_values = to_float(in.old_values, false);
  p.returns = to_float(in.returns, false);
  p.entropy = to_float(in.entropy, false);
  p.metric_mask = metric_mask_of(p, in.metric_mask);

  loss_output out;
  context c{what, p, cfg, out.metrics};
  at::Tensor per_token = entry.body(c);

  at::Tensor mask = p.mask;
  if (op_active) {
    auto corr = compute_off_policy_correction(p.old, p.roll, p.mask, op);
    mask = corr.loss_mask;
    if (corr.tis_ratio.defined())
      per_token = per_token * corr.tis_ratio;
    out.metrics.insert(corr.metrics.begin(), corr.metrics.end());
  }
  auto weighted = at::where(mask != 0, per_token * mask, at::zeros_like(per_token));
  out.loss = weighted.sum();
  out.elementwise = weighted.detach();
  out.loss_mask = mask;
  out.metrics["loss:sum"] = out.loss.item<double>();
  if (p.entropy.defined())
    out.metrics["entropy:mean"] = masked_mean(p.entropy, p.metric_mask).item<double>();
  out.metric_weight = p.metric_mask.sum().item<double>();
  return out;
}

} // namespace rlforge::backends::algo
