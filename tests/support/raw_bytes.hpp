#pragma once
// The tests' one conversion between typed values and their raw bytes (host byte order), as the
// wire codecs, tensor blobs and safetensors files hold them. Standard C++ only. An empty input
// gives an empty output without touching a null data() pointer (memcpy of null is undefined even
// for 0 bytes, and UBSan reports it).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rlforge::test_support {

/// The bytes of `values` as a string (what msgpack bin fields and protobuf bytes fields hold).
template <class T> std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty())
    std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// The bytes of `values` as a byte vector (what file buffers hold).
template <class T> std::vector<uint8_t> raw_byte_vector(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!values.empty())
    std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// The values whose bytes `bytes` holds; a trailing partial value is dropped.
template <class T> std::vector<T> from_raw(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty())
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

} // namespace rlforge::test_support
