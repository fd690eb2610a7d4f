#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "strings/format.hpp"

/// Shared pieces of the RL algorithm library (`backends/algo/`): the per-loss configuration type
/// and the masked statistics every loss, advantage estimator and correction uses.
///
/// Masked statistics follow one convention everywhere: a mean over a mask divides by the mask's
/// sum clamped to at least 1, so an all-zero mask yields 0, never NaN.
namespace rlforge::backends::algo {

/// Configuration of one loss: numeric settings (`eps_clip_low`, `beta`, ...) and string options
/// (`tis_ratio_type`, `dppo_type`, ...). Absent keys take the loss's documented default; each
/// loss validates the keys it is given (unknown keys and out-of-domain values are errors).
struct loss_config {
  std::map<std::string, double> values;       ///< numeric settings by name
  std::map<std::string, std::string> options; ///< string settings by name
};

/// Σ(x·m) / max(Σm, 1) over all elements: a scalar tensor. An undefined `mask` means all ones.
/// Throws `backends::error(invalid_argument)` for an undefined `x` or a mask of another shape
/// (naming both shapes); the same holds for `masked_row_mean` and `masked_whiten`.
at::Tensor masked_mean(const at::Tensor& x, const at::Tensor& mask);

/// Per-row masked mean of [B, R] tensors: [B], Σ_t(x·m) / max(Σ_t m, 1).
at::Tensor masked_row_mean(const at::Tensor& x, const at::Tensor& mask);

/// `(x - μ) · rsqrt(σ² + 1e-8)` with μ the masked mean and σ² the masked variance with Bessel's
/// correction (Σm / (Σm - 1)). Values at masked-out positions are transformed too (the caller
/// masks them). Throws `backends::error(invalid_argument)` when Σm ≤ 1 (the unbiased variance
/// is undefined), naming the mask sum.
at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask);

namespace detail {

/// The messages' text helpers (strings/format.hpp): "a, b, c" and "[2, 3]".
using strings::join;
using strings::shape_text;

/// Throws invalid_argument unless `t` is defined and 2-D, naming `what` and the tensor.
void require_2d(const at::Tensor& t, const std::string& name, const std::string& what);

/// Throws invalid_argument unless `t` has `shape`, naming both shapes.
void require_shape(const at::Tensor& t, const std::string& name, at::IntArrayRef shape,
                   const std::string& ref_name, const std::string& what);

/// Throws invalid_argument when `t` holds NaN or ±inf, naming the tensor.
void require_finite(const at::Tensor& t, const std::string& name, const std::string& what);


/// Shortest round-trip text of a double ("0.2", "nan", "inf").
std::string number_string(double x);

} // namespace detail

} // namespace rlforge::backends::algo
