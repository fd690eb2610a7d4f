#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// Torch-free on purpose: the fuzz build compiles this parser alone, with only nlohmann_json.

namespace rlforge::backends {

/// One tensor described by a safetensors header.
struct tensor_entry {
  std::string name;
  /// "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8" or "BOOL".
  std::string dtype;
  std::vector<int64_t> shape;
  /// Byte range [begin, end) relative to the start of the data section.
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// A parsed and validated safetensors header.
struct safetensors_header {
  /// Tensors ordered by `begin` (their order in the data section).
  std::vector<tensor_entry> tensors;
  /// The optional "__metadata__" string map.
  std::map<std::string, std::string> metadata;
  /// Where the data section starts in the file: 8 + header length.
  uint64_t data_offset = 0;
};

/// Largest header length accepted (100 MB), as a guard against hostile length prefixes.
inline constexpr uint64_t max_safetensors_header_bytes = 100'000'000;

/// Bytes per element of a safetensors dtype name; throws `error{decode_error}` naming an
/// unknown dtype.
size_t safetensors_dtype_size(const std::string& dtype);

/// True when `dtype` is one of the names `safetensors_dtype_size` knows.
bool is_safetensors_dtype(const std::string& dtype) noexcept;

/// Number of leading bytes of a file of `file_size` bytes that `parse_safetensors_header`
/// needs, read from the 8-byte little-endian length prefix in `data[0..available)`. Throws
/// `error{decode_error}` when the prefix is missing, absurd or runs past the end of the file.
uint64_t safetensors_header_bytes(const uint8_t* data, size_t available, uint64_t file_size);

/// Parses and validates the header of a safetensors file of `file_size` bytes whose first
/// `available` bytes are at `data` (at least the 8-byte prefix plus the JSON header must be
/// available; the tensor data need not be). Validation follows the published format strictly:
/// known dtypes, non-negative shapes, `data_offsets` in order, inside the file, matching
/// numel × element size (overflow-checked), neither overlapping nor leaving holes, and covering
/// the data section exactly. Throws `error{decode_error}` with a message naming the problem;
/// `error{invalid_argument}` when fewer than the header's bytes are available.
safetensors_header parse_safetensors_header(const uint8_t* data, size_t available,
                                            uint64_t file_size);

/// Builds the file prefix (8-byte little-endian length + JSON header padded with spaces to a
/// multiple of 8 bytes) for `tensors`, whose offsets the caller has already laid out.
std::string encode_safetensors_header(const std::vector<tensor_entry>& tensors,
                                      const std::map<std::string, std::string>& metadata);

} // namespace rlforge::backends
