#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <c10/core/ScalarType.h>

/// The precision a model's matrix products run in (DESIGN.md "Numerics"): `fp32`, or `bf16`
/// mixed precision (bf16 weights and activations in the GEMMs, fp32 master weights, gradients,
/// optimizer state, norms, softmax, log-probs and losses).
namespace rlforge::backends {

enum class compute_dtype { fp32, bf16 };

/// "fp32" or "bf16".
const char* to_string(compute_dtype x) noexcept;

/// Parses "fp32" / "bf16" (also "float32" / "bfloat16"). Throws `backends::error`
/// (invalid_argument) naming the string and the accepted names.
compute_dtype parse_compute_dtype(std::string_view name);

/// The torch scalar type of the GEMM operands: kFloat or kBFloat16.
c10::ScalarType gemm_scalar_type(compute_dtype x) noexcept;

/// Whether this machine has fast bf16 matrix products, and why (the CPU feature or the CUDA
/// device found, or what is missing). Computed once; thread-safe.
struct bf16_support {
  bool fast = false;
  std::string reason;
};
const bf16_support& detect_bf16_support();

/// The node's choice in the environment variable RLFORGE_COMPUTE_DTYPE (fp32 or bf16, as
/// `parse_compute_dtype` reads them), nullopt when unset or empty. Throws `backends::error`
/// (invalid_argument) naming the variable and the value when it is set to anything else.
std::optional<compute_dtype> compute_dtype_from_environment();

/// The default `compute_dtype` of training and inference where a model spec leaves it empty:
/// RLFORGE_COMPUTE_DTYPE when set (test runs and benches pin one dtype on every machine), else
/// bf16 where `detect_bf16_support().fast`, else fp32 (`rlforge score` / `generate` keep fp32
/// for exact HF numerics). Throws as `compute_dtype_from_environment` does.
compute_dtype default_compute_dtype();

} // namespace rlforge::backends
