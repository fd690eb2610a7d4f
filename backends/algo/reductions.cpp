#include "backends/algo/reductions.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "backends/algo/common.hpp"
#include "backends/error.hpp"

namespace rlforge::backends::algo {

const std::vector<std::string>& loss_reduction_names() {
  static const std::vector<std::string> names = {"token_mean", "sequence_mean",
                                                 "seq_mean_token_sum_norm", "prompt_mean"};
  return names;
}

at::Tensor scale_advantages(const at::Tensor& advantages, const at::Tensor& loss_mask,
                            const std::string& reduction, const std::vector<int64_t>& group_ids,
                            int64_t max_seq_len) {
  const std::string what = "scale_advantages(" + reduction + ")";
  const auto& names = loss_reduction_names();
  if (std::find(names.begin(), names.end(), reduction) == names.end())
    fail(error_code::invalid_argument,
         "unknown loss reduction '" + reduction + "'; valid reductions: " + detail::join(names));
  detail::require_2d(advantages, "advantages", what);
  detail::require_2d(loss_mask, "loss_mask", what);
  detail::require_shape(loss_mask, "loss_mask", advantages.sizes(), "advantages", what);
  detail::require_finite(advantages, "advantages", what);
  detail::require_finite(loss_mask, "loss_mask", what);
  auto a = advantages.to(at::kFloat);
  auto m = loss_mask.to(at::kFloat);
  if ((m < 0).any().item<bool>())
    fail(error_code::invalid_argument, what + ": 'loss_mask' has negative weights");
  const int64_t rows = a.size(0);

  if (reduction == "token_mean")
    return a / m.sum().clamp_min(1.0);
  if (reduction == "sequence_mean")
    return a / (static_cast<double>(rows) * m.sum(-1, /*keepdim=*/true).clamp_min(1.0));
  if (reduction == "seq_mean_token_sum_norm") {
    if (max_seq_len <= 0)
      fail(error_code::invalid_argument,
           what + ": needs max_seq_len > 0, got " + std::to_string(max_seq_len));
    return a / (static_cast<double>(rows) * static_cast<double>(max_seq_len));
  }
  // prompt_mean
  if (static_cast<int64_t>(group_ids.size()) != rows)
    fail(error_code::invalid_argument, what + ": needs one group id per row: got " +
                                           std::to_string(group_ids.size()) + " ids for " +
                                           std::to_string(rows) + " rows");
  auto row_tokens = m.sum(-1);
  std::map<int64_t, double> group_tokens;
  for (int64_t i = 0; i < rows; ++i)
    group_tokens[group_ids[i]] += row_tokens[i].item<double>();
  const double prompts = static_cast<double>(group_tokens.size());
  std::vector<float> denominator(rows);
  for (int64_t i = 0; i < rows; ++i)
    denominator[i] = static_cast<float>(prompts * std::max(1.0, group_tokens[group_ids[i]]));
  return a / at::tensor(denominator, at::TensorOptions().dtype(at::kFloat)).to(a.device()).unsqueeze(-1);
}

} // namespace rlforge::backends::algo
