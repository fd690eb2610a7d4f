// Fuzzes the safetensors header parser: any input either parses to a header whose tensors tile
// the data section exactly, and which re-encodes to a file that parses to the same header, or
// fails with a decode_error naming the problem. Nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/safetensors_header.hpp"
#include "fuzz/fuzz_target.hpp"

namespace rlforge::fuzz {

namespace {

using backends::tensor_entry;

std::string file_of(const std::vector<tensor_entry>& tensors,
                    const std::map<std::string, std::string>& metadata, size_t data_bytes) {
  return backends::encode_safetensors_header(tensors, metadata) + std::string(data_bytes, '\x11');
}

std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i)
    out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

bool same_entries(const std::vector<tensor_entry>& a, const std::vector<tensor_entry>& b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape ||
        a[i].begin != b[i].begin || a[i].end != b[i].end)
      return false;
  return true;
}

} // namespace

std::vector<std::string> seeds() {
  std::vector<std::string> out;
  out.push_back(
      file_of({{"w", "F32", {2, 3}, 0, 24}, {"b", "BF16", {3}, 24, 30}}, {{"format", "pt"}}, 30));
  out.push_back(file_of({{"model.embed_tokens.weight", "F16", {4, 2}, 0, 16},
                         {"scalar", "F64", {}, 16, 24},
                         {"ids", "I64", {1}, 24, 32},
                         {"mask", "BOOL", {5}, 32, 37},
                         {"q", "I8", {2}, 37, 39},
                         {"u", "U8", {1}, 39, 40},
                         {"s", "I16", {2}, 40, 44},
                         {"i", "I32", {1}, 44, 48},
                         {"empty", "F32", {0, 7}, 48, 48}},
                        {}, 48));
  out.push_back(file_of({}, {{"only", "metadata"}}, 0));
  // Near misses: overlap, hole, wrong size, unknown dtype, negative dim, truncated JSON,
  // a length prefix past the end.
  out.push_back(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                         6));
  out.push_back(raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4));
  out.push_back(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  out.push_back(raw_file(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1));
  out.push_back(raw_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1));
  out.push_back(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_o)", 1));
  out.push_back(std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10));
  return out;
}

} // namespace rlforge::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlforge::backends;
  using rlforge::fuzz::check;
  using rlforge::fuzz::same_entries;
  safetensors_header h;
  try {
    h = parse_safetensors_header(data, size, size);
  } catch (const error& e) {
    check(e.code() == error_code::decode_error,
          std::string("parse failed with code ") + to_string(e.code()) + ": " + e.what());
    check(std::string(e.what()).rfind("safetensors: ", 0) == 0, "error without a message");
    return 0;
  } catch (const std::exception& e) {
    check(false, std::string("parse let a foreign exception escape: ") + e.what());
  }

  // The tensors tile the data section, each exactly numel × element size long.
  check(h.data_offset >= 8 && h.data_offset <= size, "data offset outside the input");
  uint64_t covered = 0;
  for (const auto& t : h.tensors) {
    check(t.begin == covered, "tensor " + t.name + " does not start where the previous ended");
    uint64_t bytes = safetensors_dtype_size(t.dtype);
    for (auto d : t.shape) {
      check(d >= 0, "negative dimension accepted");
      check(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
            "size overflow accepted");
    }
    check(t.end - t.begin == bytes, "tensor " + t.name + " has a byte range of the wrong size");
    covered = t.end;
  }
  check(h.data_offset + covered == size, "tensors do not cover the data section");

  // The header alone is enough, and gives the same answer.
  auto header_only = parse_safetensors_header(data, static_cast<size_t>(h.data_offset), size);
  check(same_entries(header_only.tensors, h.tensors) && header_only.metadata == h.metadata,
        "parsing with only the header bytes differs");

  // Re-encoding gives a file that parses to the same header, and encoding is deterministic.
  std::string prefix = encode_safetensors_header(h.tensors, h.metadata);
  std::string file = prefix;
  file.append(reinterpret_cast<const char*>(data) + h.data_offset, static_cast<size_t>(covered));
  auto again = parse_safetensors_header(reinterpret_cast<const uint8_t*>(file.data()), file.size(),
                                        file.size());
  check(again.data_offset == prefix.size() && again.data_offset % 8 == 0,
        "re-encoded header is not 8-byte aligned");
  check(same_entries(again.tensors, h.tensors) && again.metadata == h.metadata,
        "parse(encode(parse(x))) differs from parse(x)");
  check(encode_safetensors_header(again.tensors, again.metadata) == prefix,
        "encode is not deterministic");
  return 0;
}
