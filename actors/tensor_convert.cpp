#include "actors/tensor_convert.hpp"

#include <cstring>
#include <exception>
#include <string>

#include <ATen/ATen.h>

#include "runtime/errc.hpp"

namespace rlforge::actors {

namespace {

std::string scalar_type_name(c10::ScalarType x) {
  return c10::toString(x);
}

} // namespace

caf::expected<c10::ScalarType> to_scalar_type(dtype x) {
  switch (x) {
  case dtype::f32:
    return c10::ScalarType::Float;
  case dtype::f64:
    return c10::ScalarType::Double;
  case dtype::f16:
    return c10::ScalarType::Half;
  case dtype::bf16:
    return c10::ScalarType::BFloat16;
  case dtype::i64:
    return c10::ScalarType::Long;
  case dtype::i32:
    return c10::ScalarType::Int;
  case dtype::i16:
    return c10::ScalarType::Short;
  case dtype::i8:
    return c10::ScalarType::Char;
  case dtype::u8:
    return c10::ScalarType::Byte;
  case dtype::boolean:
    return c10::ScalarType::Bool;
  }
  return make_error(errc::invalid_argument, "no torch scalar type for dtype code " +
                                                std::to_string(static_cast<unsigned>(x)));
}

caf::expected<dtype> to_dtype(c10::ScalarType x) {
  switch (x) {
  case c10::ScalarType::Float:
    return dtype::f32;
  case c10::ScalarType::Double:
    return dtype::f64;
  case c10::ScalarType::Half:
    return dtype::f16;
  case c10::ScalarType::BFloat16:
    return dtype::bf16;
  case c10::ScalarType::Long:
    return dtype::i64;
  case c10::ScalarType::Int:
    return dtype::i32;
  case c10::ScalarType::Short:
    return dtype::i16;
  case c10::ScalarType::Char:
    return dtype::i8;
  case c10::ScalarType::Byte:
    return dtype::u8;
  case c10::ScalarType::Bool:
    return dtype::boolean;
  default:
    break;
  }
  return make_error(errc::unsupported, "torch dtype " + scalar_type_name(x) +
                                           " has no wire dtype (supported: Float, Double, "
                                           "Half, BFloat16, Long, Int, Short, Char, Byte, Bool)");
}

caf::expected<tensor_blob> to_blob(const at::Tensor& t) {
  if (!t.defined())
    return make_error(errc::invalid_argument, "to_blob: the tensor is undefined");
  auto type = to_dtype(t.scalar_type());
  if (!type)
    return make_error(errc::unsupported, "to_blob: " + error_message(type.error()));
  if (t.layout() != c10::kStrided)
    return make_error(errc::unsupported, "to_blob: tensor layout " + c10::str(t.layout()) +
                                             " is not supported (only strided tensors)");
  if (t.dim() > static_cast<int64_t>(max_tensor_rank))
    return make_error(errc::invalid_argument, "to_blob: rank " + std::to_string(t.dim()) +
                                                  " exceeds the wire limit " +
                                                  std::to_string(max_tensor_rank));
  try {
    // detach: the copy must not record autograd history. contiguous() gathers any strided view
    // (transposed, sliced, expanded) into row-major order; views that already are contiguous and
    // on the CPU are copied exactly once, into the blob.
    at::Tensor dense = t.detach();
    if (!dense.device().is_cpu())
      dense = dense.to(c10::kCPU);
    dense = dense.resolve_conj().resolve_neg().contiguous();
    tensor_blob out;
    out.dtype = *type;
    out.shape.assign(dense.sizes().begin(), dense.sizes().end());
    auto num_bytes = dense.numel() * static_cast<int64_t>(dense.element_size());
    if (num_bytes > 0)
      out.bytes.assign(static_cast<const char*>(dense.data_ptr()), static_cast<size_t>(num_bytes));
    // Catches what torch does not guarantee: bool bytes other than 0/1 (e.g. a bool tensor made
    // over foreign memory).
    if (auto err = validate(out))
      return make_error(errc::invalid_argument, "to_blob: " + error_message(err));
    return out;
  } catch (const std::exception& e) {
    return make_error(errc::backend_error, std::string{"to_blob: torch failed: "} + e.what());
  }
}

caf::expected<at::Tensor> from_blob(const tensor_blob& x) {
  if (auto err = validate(x))
    return make_error(errc::invalid_argument, "from_blob: " + error_message(err));
  auto type = to_scalar_type(x.dtype);
  if (!type)
    return std::move(type.error());
  try {
    auto result = at::empty(c10::IntArrayRef{x.shape}, at::TensorOptions{}.dtype(*type));
    if (!x.bytes.empty())
      std::memcpy(result.data_ptr(), x.bytes.data(), x.bytes.size());
    return result;
  } catch (const std::exception& e) {
    return make_error(errc::backend_error, std::string{"from_blob: torch failed: "} + e.what());
  }
}

} // namespace rlforge::actors
