#include "backends/algo/common.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "backends/error.hpp"

namespace rlforge::backends::algo {

at::Tensor masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  if (!x.defined())
    fail(error_code::invalid_argument, "masked_mean: the input is undefined");
  if (!mask.defined())
    return x.mean();
  detail::require_shape(mask, "mask", x.sizes(), "x", "masked_mean");
  return (x * mask).sum() / mask.sum().clamp_min(1.0);
}

at::Tensor masked_row_mean(const at::Tensor& x, const at::Tensor& mask) {
  if (!x.defined() || x.dim() < 1)
    fail(error_code::invalid_argument, "masked_row_mean: need a tensor of rank >= 1");
  if (!mask.defined())
    return x.mean(-1);
  detail::require_shape(mask, "mask", x.sizes(), "x", "masked_row_mean");
  return (x * mask).sum(-1) / mask.sum(-1).clamp_min(1.0);
}

at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask) {
  if (!x.defined() || !mask.defined())
    fail(error_code::invalid_argument, "masked_whiten: needs both the values and the mask");
  detail::require_shape(mask, "mask", x.sizes(), "x", "masked_whiten");
  const double n = mask.sum().item<double>();
  if (n <= 1.0)
    fail(error_code::invalid_argument, "masked_whiten: the mask sums to " +
                                           detail::number_string(n) +
                                           "; the unbiased variance needs at least 2 valid tokens");
  auto mean = masked_mean(x, mask);
  auto centered = x - mean;
  auto var = masked_mean(centered * centered, mask) * (n / (n - 1.0));
  return centered * at::rsqrt(var + 1e-8);
}

namespace detail {



std::string number_string(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.precision(17);
  os << x;
  // Prefer the short form when it round-trips ("0.2" rather than "0.20000000000000001").
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream s;
    s.precision(p);
    s << x;
    if (std::stod(s.str()) == x)
      return s.str();
  }
  return os.str();
}

void require_2d(const at::Tensor& t, const std::string& name, const std::string& what) {
  if (!t.defined())
    fail(error_code::invalid_argument, what + ": missing input '" + name + "'");
  if (t.dim() != 2)
    fail(error_code::invalid_argument,
         what + ": '" + name + "' must be 2-D [B, R], got shape " + shape_text(t.sizes()));
}

void require_shape(const at::Tensor& t, const std::string& name, at::IntArrayRef shape,
                   const std::string& ref_name, const std::string& what) {
  if (t.sizes() != shape)
    fail(error_code::invalid_argument, what + ": '" + name + "' has shape " +
                                           shape_text(t.sizes()) + " but '" + ref_name +
                                           "' has shape " + shape_text(shape));
}

void require_finite(const at::Tensor& t, const std::string& name, const std::string& what) {
  if (!t.is_floating_point())
    return;
  if (!at::isfinite(t.detach()).all().item<bool>())
    fail(error_code::invalid_argument, what + ": '" + name + "' contains NaN or infinite values");
}

} // namespace detail

} // namespace rlforge::backends::algo
