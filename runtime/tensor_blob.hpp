#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <caf/detail/stringification_inspector.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>

namespace rlforge {

/// Element type of a `tensor_blob`. The numeric values are the dtype codes of the wire format
/// and never change; new types get new codes.
enum class dtype : uint8_t {
  f32 = 1,     ///< IEEE-754 binary32
  f64 = 2,     ///< IEEE-754 binary64
  f16 = 3,     ///< IEEE-754 binary16
  bf16 = 4,    ///< bfloat16 (upper half of a binary32)
  i64 = 5,     ///< signed two's complement, 8 bytes
  i32 = 6,     ///< signed two's complement, 4 bytes
  i16 = 7,     ///< signed two's complement, 2 bytes
  i8 = 8,      ///< signed two's complement, 1 byte
  u8 = 9,      ///< unsigned, 1 byte
  boolean = 10 ///< one byte per element, 0 (false) or 1 (true)
};

/// Every dtype, in code order.
inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64,    dtype::f16, dtype::bf16,
                                       dtype::i64, dtype::i32,    dtype::i16, dtype::i8,
                                       dtype::u8,  dtype::boolean};

/// Largest rank a `tensor_blob` may have.
inline constexpr size_t max_tensor_rank = 16;

/// Version of the msgpack layout written by `encode` and the only one `decode` accepts.
inline constexpr uint64_t tensor_blob_format_version = 1;

/// True when `code` is the code of a known dtype.
bool is_valid_dtype_code(uint64_t code) noexcept;

/// Bytes per element: 8 for f64/i64, 4 for f32/i32, 2 for f16/bf16/i16, 1 for i8/u8/bool;
/// 0 for a value outside the enumeration.
size_t element_size(dtype x) noexcept;

/// Canonical short name: "f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool";
/// "dtype(<code>)" for a value outside the enumeration.
std::string to_string(dtype x);

/// Parses a canonical name (see `to_string`) or a torch-style alias ("float32", "float",
/// "float64", "double", "float16", "half", "bfloat16", "int64", "long", "int32", "int", "int16",
/// "short", "int8", "uint8"). Fails with `errc::invalid_argument` naming the string.
caf::expected<dtype> parse_dtype(std::string_view name);

/// A dense tensor as plain bytes: the element type, the shape (row-major, contiguous) and the
/// raw element data in little-endian byte order. A blob is *valid* when its dtype is known,
/// rank <= `max_tensor_rank`, every dimension is >= 0, the element count fits in int64, `bytes`
/// holds exactly numel * element_size(dtype) bytes, and bool elements are 0 or 1 (see
/// `validate`). A 0-d scalar has an empty shape and one element.
///
/// It is a CAF message element (see `inspect` below). For bulk tensors prefer a collective:
/// CAF moves large messages slowly.
struct tensor_blob {
  rlforge::dtype dtype = rlforge::dtype::f32;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// Field-wise equality (dtype, shape and bytes; so +0.0 != -0.0 and NaNs compare by bits).
bool operator==(const tensor_blob& lhs, const tensor_blob& rhs) noexcept;

/// Negation of `==`.
inline bool operator!=(const tensor_blob& lhs, const tensor_blob& rhs) noexcept {
  return !(lhs == rhs);
}

/// Number of elements described by `shape` (1 for an empty shape), or `errc::invalid_argument`
/// naming the offending dimension when the rank exceeds `max_tensor_rank`, a dimension is
/// negative, or the count (or any contiguous stride) overflows int64.
caf::expected<int64_t> shape_numel(const std::vector<int64_t>& shape);

/// Exact byte size of a contiguous tensor of `type` and `shape`; fails like `shape_numel`, or
/// for an unknown dtype or a byte count that overflows int64.
caf::expected<size_t> expected_byte_size(dtype type, const std::vector<int64_t>& shape);

/// Checks every invariant listed on `tensor_blob`. Returns an empty error when the blob is
/// valid, else `errc::invalid_argument` with a message naming the bad value.
caf::error validate(const tensor_blob& x);

/// Writes `x` in the tensor wire format, a msgpack array of four elements:
///
///   [format_version: uint (= 1), dtype_code: uint, shape: [int...], data: bin]
///
/// The shape entries are non-negative integers; `data` is one bin element (so at most 4 GiB - 1
/// bytes) holding the raw little-endian element data. Fails with `errc::invalid_argument` when
/// `validate(x)` does, or when the data does not fit one bin element. Cost: one copy of the data.
caf::expected<std::string> encode(const tensor_blob& x);

/// `encode` into `out`, replacing its content and reusing its capacity: encoding into a buffer
/// kept across calls avoids the page faults of a fresh large allocation. On failure `out` is
/// empty.
caf::error encode_to(const tensor_blob& x, std::string& out);

/// Reads one encoded blob that must span exactly `size` bytes. Every field is checked (format
/// version, dtype code, shape entry types and signs, rank, element-count overflow, data length
/// against numel * element_size, bool values, trailing bytes); any violation or malformed msgpack
/// yields `errc::decode_error` with a message naming the bad value. Integers may use any msgpack
/// integer width (other writers need not pick the smallest). Never throws, never allocates more
/// than the input size plus a small constant. Cost: one copy of the data.
caf::expected<tensor_blob> decode(const char* data, size_t size);

/// Same as `decode(bytes.data(), bytes.size())`.
caf::expected<tensor_blob> decode(std::string_view bytes);

/// `decode` into `out`, reusing the capacity of `out.bytes` (see `encode_to`). On failure `out`
/// is unchanged.
caf::error decode_into(const char* data, size_t size, tensor_blob& out);

/// Same as `decode_into(bytes.data(), bytes.size(), out)`.
caf::error decode_into(std::string_view bytes, tensor_blob& out);

namespace detail {

/// `validate(x)` with the failure reported as `errc::decode_error` (used after CAF loads a blob).
caf::error check_deserialized(const tensor_blob& x);

} // namespace detail

/// CAF 0.17 inspection: the blob travels as (dtype code, shape, bytes), and a deserialized blob is
/// validated before it is accepted. String conversion (`caf::deep_to_string`) prints a summary
/// such as `tensor_blob("f32", [2, 3], 24)` rather than the data.
template <class Inspector> typename Inspector::result_type inspect(Inspector& f, tensor_blob& x) {
  if constexpr (std::is_same<Inspector, caf::detail::stringification_inspector>::value) {
    auto type = to_string(x.dtype);
    auto num_bytes = static_cast<uint64_t>(x.bytes.size());
    return f(caf::meta::type_name("tensor_blob"), type, x.shape, num_bytes);
  } else {
    auto code = static_cast<uint8_t>(x.dtype);
    auto load = [&]() -> caf::error { return detail::check_deserialized(x); };
    auto store_code = [&]() -> caf::error {
      x.dtype = static_cast<rlforge::dtype>(code);
      return caf::none;
    };
    return f(caf::meta::type_name("tensor_blob"), code, caf::meta::load_callback(store_code),
             x.shape, x.bytes, caf::meta::load_callback(load));
  }
}

} // namespace rlforge
