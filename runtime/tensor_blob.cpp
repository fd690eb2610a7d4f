#include "runtime/tensor_blob.hpp"

#include <cstring>
#include <exception>
#include <limits>
#include <new>

#include <msgpack.hpp>

#include "runtime/errc.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor_blob stores element data little-endian and assumes a little-endian host"
#endif

namespace rlforge {

namespace {

constexpr size_t top_level_fields = 4;

// The decoder refuses arrays longer than this before msgpack allocates their element table, so a
// forged array header cannot drive a large allocation. It is above `max_tensor_rank` so that a
// rank of 17..64 still gets a message naming the rank.
constexpr size_t max_msgpack_array = 64;

// The top-level array plus the shape array.
constexpr size_t max_msgpack_depth = 2;

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

// Index of the first byte that is neither 0 nor 1, or `size` when all are. The OR-reduction runs
// without a data-dependent branch so the compiler vectorizes it; the slow search only runs when
// there is a bad byte.
size_t first_non_boolean(const char* data, size_t size) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  unsigned char acc = 0;
  for (size_t i = 0; i < size; ++i)
    acc |= p[i];
  if ((acc & 0xFE) == 0)
    return size;
  for (size_t i = 0; i < size; ++i)
    if (p[i] > 1)
      return i;
  return size;
}

std::string bool_error(const char* data, size_t index) {
  return "bool element at index " + std::to_string(index) + " has byte value " +
         std::to_string(static_cast<unsigned>(static_cast<unsigned char>(data[index]))) +
         " (must be 0 or 1)";
}

caf::error decode_failure(const std::string& what) {
  return make_error(errc::decode_error, "tensor_blob decode: " + what);
}

const char* msgpack_type_name(msgpack::type::object_type t) {
  switch (t) {
  case msgpack::type::NIL:
    return "nil";
  case msgpack::type::BOOLEAN:
    return "boolean";
  case msgpack::type::POSITIVE_INTEGER:
    return "unsigned integer";
  case msgpack::type::NEGATIVE_INTEGER:
    return "negative integer";
  case msgpack::type::FLOAT32:
    return "float32";
  case msgpack::type::FLOAT64:
    return "float64";
  case msgpack::type::STR:
    return "str";
  case msgpack::type::BIN:
    return "bin";
  case msgpack::type::ARRAY:
    return "array";
  case msgpack::type::MAP:
    return "map";
  case msgpack::type::EXT:
    return "ext";
  }
  return "unknown msgpack type";
}

// Makes msgpack reference str/bin/ext payloads in the input instead of copying them into its
// zone: the only copy of the tensor data is the one into the result blob.
bool reference_everything(msgpack::type::object_type, std::size_t, void*) {
  return true;
}

// Appends packed bytes to a string (the stream concept of msgpack::packer).
struct string_sink {
  std::string& out;
  void write(const char* data, size_t size) { out.append(data, size); }
};

// Reads an unsigned top-level field; `what` names it in errors.
caf::expected<uint64_t> read_unsigned(const msgpack::object& o, const char* what) {
  if (o.type == msgpack::type::POSITIVE_INTEGER)
    return o.via.u64;
  if (o.type == msgpack::type::NEGATIVE_INTEGER)
    return decode_failure(std::string{what} + " is negative (" + std::to_string(o.via.i64) + ")");
  return decode_failure(std::string{what} + " is a " + msgpack_type_name(o.type) +
                        ", expected an unsigned integer");
}

// A validated encoding whose data still lives in the input buffer.
struct parsed_blob {
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const char* data = nullptr;
  size_t size = 0;
};

caf::expected<parsed_blob> parse_object(const msgpack::object& root) {
  if (root.type != msgpack::type::ARRAY)
    return decode_failure(std::string{"top-level value is a "} + msgpack_type_name(root.type) +
                          ", expected an array of 4 elements");
  if (root.via.array.size != top_level_fields)
    return decode_failure("top-level array has " + std::to_string(root.via.array.size) +
                          " elements, expected 4 (version, dtype, shape, data)");
  const msgpack::object* fields = root.via.array.ptr;
  auto version = read_unsigned(fields[0], "format version");
  if (!version)
    return std::move(version.error());
  if (*version != tensor_blob_format_version)
    return decode_failure("unsupported format version " + std::to_string(*version) +
                          " (this build reads version " +
                          std::to_string(tensor_blob_format_version) + ")");
  auto code = read_unsigned(fields[1], "dtype code");
  if (!code)
    return std::move(code.error());
  if (!is_valid_dtype_code(*code))
    return decode_failure("unknown dtype code " + std::to_string(*code));
  parsed_blob result;
  result.type = static_cast<dtype>(*code);
  const msgpack::object& shape = fields[2];
  if (shape.type != msgpack::type::ARRAY)
    return decode_failure(std::string{"shape is a "} + msgpack_type_name(shape.type) +
                          ", expected an array of integers");
  if (shape.via.array.size > max_tensor_rank)
    return decode_failure("rank " + std::to_string(shape.via.array.size) + " exceeds the limit " +
                          std::to_string(max_tensor_rank));
  result.shape.reserve(shape.via.array.size);
  for (uint32_t i = 0; i < shape.via.array.size; ++i) {
    const msgpack::object& dim = shape.via.array.ptr[i];
    if (dim.type == msgpack::type::NEGATIVE_INTEGER)
      return decode_failure("dimension " + std::to_string(i) + " is negative (" +
                            std::to_string(dim.via.i64) + ")");
    if (dim.type != msgpack::type::POSITIVE_INTEGER)
      return decode_failure("dimension " + std::to_string(i) + " is a " +
                            msgpack_type_name(dim.type) + ", expected an integer");
    if (dim.via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return decode_failure("dimension " + std::to_string(i) + " is " +
                            std::to_string(dim.via.u64) + ", larger than int64 allows");
    result.shape.push_back(static_cast<int64_t>(dim.via.u64));
  }
  const msgpack::object& data = fields[3];
  if (data.type != msgpack::type::BIN)
    return decode_failure(std::string{"data is a "} + msgpack_type_name(data.type) +
                          ", expected bin");
  auto needed = expected_byte_size(result.type, result.shape);
  if (!needed)
    return decode_failure(error_message(needed.error()));
  if (*needed != data.via.bin.size)
    return decode_failure("data has " + std::to_string(data.via.bin.size) + " bytes, but dtype " +
                          to_string(result.type) + " and shape " + shape_to_string(result.shape) +
                          " need " + std::to_string(*needed));
  if (result.type == dtype::boolean) {
    auto bad = first_non_boolean(data.via.bin.ptr, data.via.bin.size);
    if (bad != data.via.bin.size)
      return decode_failure(bool_error(data.via.bin.ptr, bad));
  }
  result.data = data.via.bin.ptr;
  result.size = data.via.bin.size;
  return result;
}

} // namespace

bool is_valid_dtype_code(uint64_t code) noexcept {
  for (auto x : all_dtypes)
    if (static_cast<uint64_t>(x) == code)
      return true;
  return false;
}

size_t element_size(dtype x) noexcept {
  switch (x) {
  case dtype::f64:
  case dtype::i64:
    return 8;
  case dtype::f32:
  case dtype::i32:
    return 4;
  case dtype::f16:
  case dtype::bf16:
  case dtype::i16:
    return 2;
  case dtype::i8:
  case dtype::u8:
  case dtype::boolean:
    return 1;
  }
  return 0;
}

std::string to_string(dtype x) {
  switch (x) {
  case dtype::f32:
    return "f32";
  case dtype::f64:
    return "f64";
  case dtype::f16:
    return "f16";
  case dtype::bf16:
    return "bf16";
  case dtype::i64:
    return "i64";
  case dtype::i32:
    return "i32";
  case dtype::i16:
    return "i16";
  case dtype::i8:
    return "i8";
  case dtype::u8:
    return "u8";
  case dtype::boolean:
    return "bool";
  }
  return "dtype(" + std::to_string(static_cast<unsigned>(x)) + ")";
}

caf::expected<dtype> parse_dtype(std::string_view name) {
  struct alias {
    std::string_view name;
    dtype type;
  };
  static constexpr alias aliases[] = {
      {"float32", dtype::f32},   {"float", dtype::f32},   {"float64", dtype::f64},
      {"double", dtype::f64},    {"float16", dtype::f16}, {"half", dtype::f16},
      {"bfloat16", dtype::bf16}, {"int64", dtype::i64},   {"long", dtype::i64},
      {"int32", dtype::i32},     {"int", dtype::i32},     {"int16", dtype::i16},
      {"short", dtype::i16},     {"int8", dtype::i8},     {"uint8", dtype::u8},
  };
  for (auto x : all_dtypes)
    if (to_string(x) == name)
      return x;
  for (const auto& a : aliases)
    if (a.name == name)
      return a.type;
  return make_error(errc::invalid_argument,
                    "unknown dtype name \"" + std::string{name} +
                        "\" (expected one of f32, f64, f16, bf16, i64, i32, i16, i8, u8, bool)");
}

bool operator==(const tensor_blob& lhs, const tensor_blob& rhs) noexcept {
  return lhs.dtype == rhs.dtype && lhs.shape == rhs.shape && lhs.bytes == rhs.bytes;
}

caf::expected<int64_t> shape_numel(const std::vector<int64_t>& shape) {
  if (shape.size() > max_tensor_rank)
    return make_error(errc::invalid_argument, "rank " + std::to_string(shape.size()) +
                                                  " exceeds the limit " +
                                                  std::to_string(max_tensor_rank));
  // Contiguous strides are products of max(dim, 1) (as torch computes them), so that product
  // must fit in int64 even when a zero dimension makes the element count 0.
  int64_t stride_product = 1;
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    auto dim = shape[i];
    if (dim < 0)
      return make_error(errc::invalid_argument, "dimension " + std::to_string(i) +
                                                    " is negative (" + std::to_string(dim) +
                                                    ") in shape " + shape_to_string(shape));
    if (dim == 0) {
      has_zero = true;
      continue;
    }
    if (__builtin_mul_overflow(stride_product, dim, &stride_product))
      return make_error(errc::invalid_argument, "element count of shape " + shape_to_string(shape) +
                                                    " overflows int64 at dimension " +
                                                    std::to_string(i));
  }
  return has_zero ? int64_t{0} : stride_product;
}

caf::expected<size_t> expected_byte_size(dtype type, const std::vector<int64_t>& shape) {
  auto size = element_size(type);
  if (size == 0)
    return make_error(errc::invalid_argument,
                      "unknown dtype code " + std::to_string(static_cast<unsigned>(type)));
  auto numel = shape_numel(shape);
  if (!numel)
    return std::move(numel.error());
  int64_t bytes = 0;
  if (__builtin_mul_overflow(*numel, static_cast<int64_t>(size), &bytes))
    return make_error(errc::invalid_argument, "byte size of dtype " + to_string(type) +
                                                  " and shape " + shape_to_string(shape) +
                                                  " overflows int64");
  return static_cast<size_t>(bytes);
}

caf::error validate(const tensor_blob& x) {
  auto needed = expected_byte_size(x.dtype, x.shape);
  if (!needed)
    return std::move(needed.error());
  if (*needed != x.bytes.size())
    return make_error(errc::invalid_argument, "blob holds " + std::to_string(x.bytes.size()) +
                                                  " bytes, but dtype " + to_string(x.dtype) +
                                                  " and shape " + shape_to_string(x.shape) +
                                                  " need " + std::to_string(*needed));
  if (x.dtype == dtype::boolean) {
    auto bad = first_non_boolean(x.bytes.data(), x.bytes.size());
    if (bad != x.bytes.size())
      return make_error(errc::invalid_argument, bool_error(x.bytes.data(), bad));
  }
  return caf::none;
}

namespace detail {

caf::error check_deserialized(const tensor_blob& x) {
  if (auto err = validate(x))
    return make_error(errc::decode_error, "tensor_blob deserialize: " + error_message(err));
  return caf::none;
}

} // namespace detail

caf::error encode_to(const tensor_blob& x, std::string& out) {
  out.clear();
  if (auto err = validate(x))
    return err;
  if (x.bytes.size() > std::numeric_limits<uint32_t>::max())
    return make_error(errc::invalid_argument,
                      "tensor data of " + std::to_string(x.bytes.size()) +
                          " bytes exceeds the 4 GiB - 1 limit of one encoded blob");
  try {
    // Header: array tag, version, dtype code, shape array tag, <= 9 bytes per dimension, bin tag.
    out.reserve(x.bytes.size() + 16 + 9 * x.shape.size());
    string_sink sink{out};
    msgpack::packer<string_sink> pk{sink};
    pk.pack_array(static_cast<uint32_t>(top_level_fields));
    pk.pack_uint64(tensor_blob_format_version);
    pk.pack_uint8(static_cast<uint8_t>(x.dtype));
    pk.pack_array(static_cast<uint32_t>(x.shape.size()));
    for (auto dim : x.shape)
      pk.pack_int64(dim);
    pk.pack_bin(static_cast<uint32_t>(x.bytes.size()));
    pk.pack_bin_body(x.bytes.data(), static_cast<uint32_t>(x.bytes.size()));
  } catch (const std::bad_alloc&) {
    out.clear();
    return make_error(errc::internal, "tensor_blob encode: out of memory for " +
                                          std::to_string(x.bytes.size()) + " bytes");
  }
  return caf::none;
}

caf::expected<std::string> encode(const tensor_blob& x) {
  std::string out;
  if (auto err = encode_to(x, out))
    return err;
  return out;
}

caf::error decode_into(const char* data, size_t size, tensor_blob& out) {
  if (size == 0)
    return decode_failure("empty input (0 bytes)");
  if (data == nullptr)
    return decode_failure("null data pointer with size " + std::to_string(size));
  msgpack::unpack_limit limit{max_msgpack_array,
                              0,
                              std::numeric_limits<uint32_t>::max(),
                              std::numeric_limits<uint32_t>::max(),
                              std::numeric_limits<uint32_t>::max(),
                              max_msgpack_depth};
  try {
    size_t offset = 0;
    bool referenced = false;
    auto handle =
        msgpack::unpack(data, size, offset, referenced, reference_everything, nullptr, limit);
    auto parsed = parse_object(handle.get());
    if (!parsed)
      return std::move(parsed.error());
    if (offset != size)
      return decode_failure(std::to_string(size - offset) + " trailing bytes after the " +
                            std::to_string(offset) + "-byte encoded blob");
    // The copy goes first: if it throws, `out` is unchanged.
    out.bytes.assign(parsed->data, parsed->size);
    out.dtype = parsed->type;
    out.shape = std::move(parsed->shape);
    return caf::none;
  } catch (const msgpack::insufficient_bytes&) {
    return decode_failure("truncated input: " + std::to_string(size) +
                          " bytes end inside a msgpack value");
  } catch (const msgpack::array_size_overflow&) {
    return decode_failure("a msgpack array is longer than " + std::to_string(max_msgpack_array) +
                          " elements");
  } catch (const msgpack::map_size_overflow&) {
    return decode_failure("unexpected non-empty msgpack map");
  } catch (const msgpack::depth_size_overflow&) {
    return decode_failure("msgpack nesting deeper than " + std::to_string(max_msgpack_depth) +
                          " levels");
  } catch (const msgpack::parse_error& e) {
    return decode_failure(std::string{"malformed msgpack: "} + e.what());
  } catch (const msgpack::unpack_error& e) {
    return decode_failure(std::string{"msgpack rejected the input: "} + e.what());
  } catch (const std::bad_alloc&) {
    return decode_failure("out of memory while decoding " + std::to_string(size) + " bytes");
  } catch (const std::exception& e) {
    return decode_failure(std::string{"unexpected failure: "} + e.what());
  }
}

caf::expected<tensor_blob> decode(const char* data, size_t size) {
  tensor_blob out;
  if (auto err = decode_into(data, size, out))
    return err;
  return out;
}

caf::expected<tensor_blob> decode(std::string_view bytes) {
  // A default-constructed view has a null data pointer; it is simply empty input.
  return decode(bytes.empty() ? "" : bytes.data(), bytes.size());
}

caf::error decode_into(std::string_view bytes, tensor_blob& out) {
  return decode_into(bytes.empty() ? "" : bytes.data(), bytes.size(), out);
}

} // namespace rlforge
