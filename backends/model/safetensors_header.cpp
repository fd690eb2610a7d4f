#include "backends/model/safetensors_header.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "backends/error.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

namespace {

using nlohmann::json;

// The deepest container a valid header holds: root object → entry object → shape array.
constexpr int max_container_depth = 2;

[[noreturn]] void bad(const std::string& what) {
  fail(error_code::decode_error, "safetensors: " + what);
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i)
    x = (x << 8) | p[i];
  return x;
}

using strings::in_quotes;

using strings::shape_text;

json parse_json(const char* begin, const char* end) {
  // One set of keys per open object: nlohmann keeps the last of duplicate keys silently, which
  // would let two entries for one tensor name slip through.
  std::vector<std::set<std::string>> keys;
  auto callback = [&keys](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
    case json::parse_event_t::object_start:
    case json::parse_event_t::array_start:
      if (depth > max_container_depth)
        bad("header nests containers deeper than " + std::to_string(max_container_depth) +
            " levels");
      if (event == json::parse_event_t::object_start)
        keys.emplace_back();
      break;
    case json::parse_event_t::object_end:
      if (!keys.empty())
        keys.pop_back();
      break;
    case json::parse_event_t::key:
      if (!keys.empty() && parsed.is_string()) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(k).second)
          bad("duplicate key " + in_quotes(k) + " in header");
      }
      break;
    default:
      break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback);
  } catch (const json::exception& e) {
    bad(std::string("header is not valid JSON: ") + e.what());
  }
}

int64_t parse_dim(const std::string& name, const json& v) {
  if (v.is_number_unsigned()) {
    auto x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad("tensor " + in_quotes(name) + " has dimension " + std::to_string(x) + ", too large");
    return static_cast<int64_t>(x);
  }
  if (v.is_number_integer())
    bad("tensor " + in_quotes(name) + " has negative dimension " +
        std::to_string(v.get<int64_t>()));
  bad("tensor " + in_quotes(name) + " has a shape entry that is not an integer: " + v.dump());
}

uint64_t parse_offset(const std::string& name, const json& v) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>();
  if (v.is_number_integer())
    bad("tensor " + in_quotes(name) + " has negative data offset " +
        std::to_string(v.get<int64_t>()));
  bad("tensor " + in_quotes(name) + " has a data offset that is not an integer: " + v.dump());
}

tensor_entry parse_entry(const std::string& name, const json& v, uint64_t data_size) {
  if (!v.is_object())
    bad("entry for tensor " + in_quotes(name) + " is not an object");
  tensor_entry t;
  t.name = name;

  auto dtype = v.find("dtype");
  if (dtype == v.end())
    bad("tensor " + in_quotes(name) + " has no 'dtype'");
  if (!dtype->is_string())
    bad("tensor " + in_quotes(name) + " has a 'dtype' that is not a string");
  t.dtype = dtype->get<std::string>();
  if (!is_safetensors_dtype(t.dtype))
    bad("tensor " + in_quotes(name) + " has unknown dtype " + in_quotes(t.dtype));

  auto shape = v.find("shape");
  if (shape == v.end())
    bad("tensor " + in_quotes(name) + " has no 'shape'");
  if (!shape->is_array())
    bad("tensor " + in_quotes(name) + " has a 'shape' that is not an array");
  t.shape.reserve(shape->size());
  for (const auto& d : *shape)
    t.shape.push_back(parse_dim(name, d));

  auto offsets = v.find("data_offsets");
  if (offsets == v.end())
    bad("tensor " + in_quotes(name) + " has no 'data_offsets'");
  if (!offsets->is_array() || offsets->size() != 2)
    bad("tensor " + in_quotes(name) + " has 'data_offsets' that are not a [begin, end] pair");
  t.begin = parse_offset(name, (*offsets)[0]);
  t.end = parse_offset(name, (*offsets)[1]);
  if (t.end < t.begin)
    bad("tensor " + in_quotes(name) + " has data_offsets [" + std::to_string(t.begin) + ", " +
        std::to_string(t.end) + "] whose end is before its begin");
  if (t.end > data_size)
    bad("tensor " + in_quotes(name) + " has data_offsets [" + std::to_string(t.begin) + ", " +
        std::to_string(t.end) + "] out of range of the " + std::to_string(data_size) +
        "-byte data section");

  uint64_t bytes = safetensors_dtype_size(t.dtype);
  for (auto d : t.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      bad("tensor " + in_quotes(name) + " of shape " + shape_text(t.shape) + " and dtype " +
          t.dtype + " has a byte size that overflows 64 bits");
  }
  if (t.end - t.begin != bytes)
    bad("tensor " + in_quotes(name) + " of shape " + shape_text(t.shape) + " and dtype " + t.dtype +
        " needs " + std::to_string(bytes) + " bytes but its data_offsets span " +
        std::to_string(t.end - t.begin));
  return t;
}

} // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::pair<const char*, size_t> sizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
  };
  for (const auto& [name, size] : sizes)
    if (dtype == name)
      return size;
  fail(error_code::decode_error, "safetensors: unknown dtype " + in_quotes(dtype) +
                                     " (known: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
}

bool is_safetensors_dtype(const std::string& dtype) noexcept {
  try {
    safetensors_dtype_size(dtype);
    return true;
  } catch (const error&) {
    return false;
  }
}

uint64_t safetensors_header_bytes(const uint8_t* data, size_t available, uint64_t file_size) {
  if (file_size < 8)
    bad("file is " + std::to_string(file_size) +
        " bytes, shorter than the 8-byte header length prefix");
  if (data == nullptr || available < 8)
    fail(error_code::invalid_argument,
         "safetensors: the 8-byte header length prefix was not provided (" +
             std::to_string(available) + " bytes available)");
  uint64_t header_len = read_le64(data);
  if (header_len > max_safetensors_header_bytes)
    bad("header length " + std::to_string(header_len) + " exceeds the limit of " +
        std::to_string(max_safetensors_header_bytes) + " bytes");
  if (header_len > file_size - 8)
    bad("header length " + std::to_string(header_len) + " runs past the end of the " +
        std::to_string(file_size) + "-byte file");
  return 8 + header_len;
}

safetensors_header parse_safetensors_header(const uint8_t* data, size_t available,
                                            uint64_t file_size) {
  if (available > file_size)
    fail(error_code::invalid_argument, "safetensors: " + std::to_string(available) +
                                           " bytes available but the file is only " +
                                           std::to_string(file_size) + " bytes");
  uint64_t prefix = safetensors_header_bytes(data, available, file_size);
  if (available < prefix)
    fail(error_code::invalid_argument, "safetensors: the header needs " + std::to_string(prefix) +
                                           " bytes but only " + std::to_string(available) +
                                           " were provided");

  const char* begin = reinterpret_cast<const char*>(data) + 8;
  const char* end = reinterpret_cast<const char*>(data) + prefix;
  if (begin == end || *begin != '{')
    bad("header does not start with '{'");
  json root = parse_json(begin, end);
  if (!root.is_object())
    bad("header is not a JSON object");

  safetensors_header h;
  h.data_offset = prefix;
  uint64_t data_size = file_size - prefix;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        bad("'__metadata__' is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          bad("metadata value for " + in_quotes(mk) + " is not a string");
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, data_size));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const tensor_entry& a, const tensor_entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // Tensors must tile the data section exactly, in order, as the reference writer lays them out.
  uint64_t expected = 0;
  const tensor_entry* previous = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < expected)
      bad("tensor " + in_quotes(t.name) + " at data_offsets [" + std::to_string(t.begin) + ", " +
          std::to_string(t.end) + "] overlaps tensor " + in_quotes(previous->name) + " at [" +
          std::to_string(previous->begin) + ", " + std::to_string(previous->end) + "]");
    if (t.begin > expected)
      bad("hole of " + std::to_string(t.begin - expected) + " bytes before tensor " +
          in_quotes(t.name) + " at data offset " + std::to_string(expected));
    expected = t.end;
    previous = &t;
  }
  if (expected != data_size)
    bad(std::to_string(data_size - expected) + " bytes after the last tensor are not covered by " +
        "any tensor (data section is " + std::to_string(data_size) + " bytes)");
  return h;
}

std::string encode_safetensors_header(const std::vector<tensor_entry>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  json root = json::object();
  for (const auto& t : tensors) {
    if (t.name == "__metadata__")
      fail(error_code::invalid_argument,
           "safetensors: '__metadata__' is reserved, not a tensor name");
    if (root.contains(t.name))
      fail(error_code::invalid_argument, "safetensors: duplicate tensor name " + in_quotes(t.name));
    if (!is_safetensors_dtype(t.dtype))
      fail(error_code::invalid_argument,
           "safetensors: tensor " + in_quotes(t.name) + " has unknown dtype " + in_quotes(t.dtype));
    root[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  if (!metadata.empty())
    root["__metadata__"] = metadata;
  std::string text;
  try {
    text = root.dump();
  } catch (const json::exception& e) {
    fail(error_code::invalid_argument,
         std::string("safetensors: a tensor name or metadata entry is not valid UTF-8: ") +
             e.what());
  }
  // Pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

} // namespace rlforge::backends
