#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlforge::backends {

/// Delta encoding of weight transfers: only the elements whose bits changed since the version
/// the receiver holds. Pure functions on byte ranges (no torch, no I/O); the collective
/// transports (gloo_transport.hpp) use them bucket by bucket. Elements are compared bit for bit
/// (NaN payloads and -0.0 included), so decoding the delta over the old bytes reproduces the new
/// bytes exactly.
///
/// Wire layout of one encoded bucket: a directory of one little-endian uint64 per tensor,
/// `(encoding << 56) | changed`, then each tensor's section in the same order, unpadded:
///  - `full`:    the tensor's bytes;
///  - `indices`: `changed` uint32 element indices (ascending), then `changed` values;
///  - `bitmap`:  ceil(n / 8) bytes, bit i (LSB first) set for a changed element i, then the
///               `changed` values in element order.
enum class delta_encoding : std::uint8_t { full = 0, indices = 1, bitmap = 2 };

/// The name of an encoding ("full", "indices", "bitmap").
const char* delta_encoding_name(delta_encoding e) noexcept;

/// One tensor's bytes before and after (both `bytes` long, `bytes` a multiple of
/// `element_size`, which is 1, 2, 4 or 8). The pointers need no alignment.
struct delta_tensor {
  const std::uint8_t* before = nullptr;
  const std::uint8_t* after = nullptr;
  std::uint64_t bytes = 0;
  std::size_t element_size = 4;
};

/// The encoding chosen for one tensor and its section's size.
struct delta_choice {
  delta_encoding encoding = delta_encoding::full;
  std::uint64_t changed = 0; ///< elements whose bits differ
  std::uint64_t bytes = 0;   ///< the section's size
};

/// Counts the changed elements of `t` and picks the smallest section (`full` on ties; `indices`
/// only for tensors of at most 2^32 elements). Throws `error{invalid_argument}` for an element
/// size other than 1, 2, 4 or 8 or a size that is not a multiple of it.
delta_choice choose_delta(const delta_tensor& t);

/// The encoded size of a bucket whose tensors got `choices`: the directory plus the sections.
std::uint64_t delta_bucket_bytes(const std::vector<delta_choice>& choices);

/// Writes the encoding of `tensors` (with the `choices` `choose_delta` made for them, in the
/// same order) to `out`, which holds `delta_bucket_bytes(choices)` bytes. Throws
/// `error{invalid_argument}` when the two lists differ in length.
void encode_delta_bucket(const std::vector<delta_tensor>& tensors,
                         const std::vector<delta_choice>& choices, std::uint8_t* out);

/// Where one tensor of a bucket is decoded: its bytes before (`base`) and where its bytes after
/// go (`out`, `bytes` long; may equal `base` to decode in place; otherwise the two must not
/// overlap).
struct delta_target {
  const std::uint8_t* base = nullptr;
  std::uint8_t* out = nullptr;
  std::uint64_t bytes = 0;
  std::size_t element_size = 4;
};

/// Decodes one bucket of `encoded_bytes` bytes into `targets` (in the sender's order): `out`
/// receives `base` with the changed elements replaced. Everything is checked before use: a
/// directory entry with an unknown encoding, a count above the tensor's elements, an index out
/// of range or not ascending, a bitmap whose set bits disagree with its count, or sections that
/// do not add up to `encoded_bytes` throw `error{decode_error}` naming the tensor's position;
/// targets before it may already be written.
void decode_delta_bucket(const std::uint8_t* encoded, std::uint64_t encoded_bytes,
                         const std::vector<delta_target>& targets);

} // namespace rlforge::backends
