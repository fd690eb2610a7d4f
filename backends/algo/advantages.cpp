#include "backends/algo/advantages.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "backends/algo/common.hpp"
#include "backends/error.hpp"

namespace rlforge::backends::algo {

namespace {

using detail::number_string;

struct group_stats {
  int64_t n = 0;
  double mean = 0.0;
  double std = 1.0; // unbiased; only meaningful for n > 1
};

// Per-row scores and per-group statistics, in double.
std::vector<double> row_scores(const at::Tensor& rewards) {
  auto s = rewards.to(at::kDouble).sum(-1).contiguous();
  return std::vector<double>(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
}

std::map<int64_t, group_stats> group_statistics(const std::vector<double>& s,
                                                const std::vector<int64_t>& ids) {
  std::map<int64_t, std::vector<double>> members;
  for (size_t i = 0; i < s.size(); ++i)
    members[ids[i]].push_back(s[i]);
  std::map<int64_t, group_stats> out;
  for (const auto& [id, xs] : members) {
    group_stats g;
    g.n = static_cast<int64_t>(xs.size());
    if (g.n > 1) {
      double sum = 0;
      for (double x : xs)
        sum += x;
      g.mean = sum / static_cast<double>(g.n);
      double sq = 0;
      for (double x : xs)
        sq += (x - g.mean) * (x - g.mean);
      g.std = std::sqrt(sq / static_cast<double>(g.n - 1));
    }
    out[id] = g;
  }
  return out;
}

// Broadcasts one value per row over the response mask; advantages = returns.
advantage_output broadcast(const std::vector<double>& per_row, const at::Tensor& mask) {
  std::vector<float> v(per_row.begin(), per_row.end());
  auto a = at::tensor(v, at::TensorOptions().dtype(at::kFloat)).unsqueeze(-1) * mask;
  return {a, a};
}

advantage_output grpo(const advantage_inputs& in, const at::Tensor& mask,
                      const advantage_config& cfg) {
  auto s = row_scores(in.rewards);
  auto groups = group_statistics(s, in.group_ids);
  std::vector<double> a(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& g = groups[in.group_ids[i]];
    a[i] = cfg.norm_by_std ? (s[i] - g.mean) / (g.std + cfg.epsilon) : s[i] - g.mean;
  }
  return broadcast(a, mask);
}

advantage_output rloo(const advantage_inputs& in, const at::Tensor& mask) {
  auto s = row_scores(in.rewards);
  auto groups = group_statistics(s, in.group_ids);
  std::vector<double> a(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& g = groups[in.group_ids[i]];
    const double n = static_cast<double>(g.n);
    a[i] = g.n > 1 ? (s[i] - g.mean) * n / (n - 1.0) : 0.0;
  }
  return broadcast(a, mask);
}

advantage_output maxrl(const advantage_inputs& in, const at::Tensor& mask,
                       const advantage_config& cfg) {
  auto s = row_scores(in.rewards);
  auto groups = group_statistics(s, in.group_ids);
  std::vector<double> a(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t id = in.group_ids[i];
    const auto& g = groups[id];
    if (g.n > 1) {
      const double denominator = g.mean + cfg.epsilon;
      if (denominator == 0.0)
        fail(error_code::invalid_argument, "compute_advantages(maxrl): group " +
                                               std::to_string(id) + " has mean score " +
                                               number_string(g.mean) + ", so mean + epsilon is 0");
      a[i] = (s[i] - g.mean) / denominator;
    } else {
      a[i] = s[i];
    }
  }
  return broadcast(a, mask);
}

advantage_output reinforce_pp(const advantage_inputs& in, const at::Tensor& mask,
                              const advantage_config& cfg) {
  auto r = in.rewards.to(at::kFloat);
  auto returns = at::zeros_like(r);
  auto running = at::zeros({r.size(0)}, r.options());
  for (int64_t t = r.size(1) - 1; t >= 0; --t) {
    running = r.select(1, t) + cfg.gamma * running;
    returns.select(1, t).copy_(running);
    running = running * mask.select(1, t);
  }
  return {masked_whiten(returns, mask) * mask, returns};
}

advantage_output gae(const advantage_inputs& in, const at::Tensor& mask,
                     const advantage_config& cfg) {
  auto r = in.rewards.to(at::kFloat);
  auto v = in.values.to(at::kFloat).detach();
  const int64_t len = r.size(1);
  auto adv = at::zeros_like(r);
  auto last = at::zeros({r.size(0)}, r.options());
  for (int64_t t = len - 1; t >= 0; --t) {
    auto next_v = t + 1 < len ? v.select(1, t + 1) : at::zeros_like(last);
    auto delta = r.select(1, t) + cfg.gamma * next_v - v.select(1, t);
    last = delta + cfg.gamma * cfg.lambd * last;
    adv.select(1, t).copy_(last);
  }
  auto returns = adv + v;
  return {masked_whiten(adv, mask), returns};
}

void check_unit_interval(const std::string& what, const std::string& key, double v) {
  if (!(v >= 0.0 && v <= 1.0))
    fail(error_code::invalid_argument,
         what + ": '" + key + "' must be in [0, 1], got " + number_string(v));
}

} // namespace

const std::vector<std::string>& advantage_estimator_names() {
  static const std::vector<std::string> names = {"grpo", "rloo", "reinforce++", "gae", "maxrl"};
  return names;
}

advantage_output compute_advantages(const std::string& name, const advantage_inputs& in,
                                    const advantage_config& cfg) {
  const auto& names = advantage_estimator_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    fail(error_code::invalid_argument,
         "unknown advantage estimator '" + name + "'; valid estimators: " + detail::join(names));
  const std::string what = "compute_advantages(" + name + ")";
  check_unit_interval(what, "gamma", cfg.gamma);
  check_unit_interval(what, "lambd", cfg.lambd);
  if (!std::isfinite(cfg.epsilon) || !(cfg.epsilon > 0))
    fail(error_code::invalid_argument,
         what + ": 'epsilon' must be a finite number > 0, got " + number_string(cfg.epsilon));

  detail::require_2d(in.rewards, "rewards", what);
  detail::require_2d(in.response_mask, "response_mask", what);
  detail::require_shape(in.response_mask, "response_mask", in.rewards.sizes(), "rewards", what);
  detail::require_finite(in.rewards, "rewards", what);
  detail::require_finite(in.response_mask, "response_mask", what);
  if (name == "gae") {
    detail::require_2d(in.values, "values", what);
    detail::require_shape(in.values, "values", in.rewards.sizes(), "rewards", what);
    detail::require_finite(in.values, "values", what);
  }
  const bool grouped = name == "grpo" || name == "rloo" || name == "maxrl";
  if (grouped && static_cast<int64_t>(in.group_ids.size()) != in.rewards.size(0))
    fail(error_code::invalid_argument, what + ": needs one group id per row: got " +
                                           std::to_string(in.group_ids.size()) + " ids for " +
                                           std::to_string(in.rewards.size(0)) + " rows");

  c10::NoGradGuard no_grad;
  auto mask = in.response_mask.to(at::kFloat);
  if (name == "grpo")
    return grpo(in, mask, cfg);
  if (name == "rloo")
    return rloo(in, mask);
  if (name == "maxrl")
    return maxrl(in, mask, cfg);
  if (name == "reinforce++")
    return reinforce_pp(in, mask, cfg);
  return gae(in, mask, cfg);
}

std::vector<int64_t> group_ids_from_tensor(const at::Tensor& ids) {
  if (!ids.defined() || ids.dim() != 1)
    fail(error_code::invalid_argument,
         "group_ids_from_tensor: need a 1-D tensor, got " +
             (ids.defined() ? detail::shape_text(ids.sizes()) : std::string("an undefined one")));
  if (at::isFloatingType(ids.scalar_type()) || at::isComplexType(ids.scalar_type()) ||
      ids.scalar_type() == at::kBool)
    fail(error_code::invalid_argument, "group_ids_from_tensor: need an integer tensor, got " +
                                           std::string(c10::toString(ids.scalar_type())));
  auto l = ids.to(at::kLong).contiguous();
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
}

} // namespace rlforge::backends::algo
