#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "strings/format.hpp"
#include "service/tinker.pb.h"
#include "service/wire/limits.hpp"
#include "tinker/error.hpp"
#include "tinker/types.hpp"

// The wire formats are little-endian; so is every machine rlforge builds for. Element bytes are
// copied with memcpy, so unaligned protobuf byte fields are fine.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the Tinker wire codecs assume a little-endian host");

/// What every codec of the Tinker wire formats (service/wire/) shares: error helpers, tensor
/// element bytes, dense and sparse tensors from protobuf and JSON, and JSON field access. Internal
/// to the codecs. Reentrant: no shared state.
namespace rlforge::service::wire_detail {

using json = nlohmann::json;
using tinker::dtype;
using tinker::request_error;

/// Throws `tinker::request_error` (user) / (server) with `message`.
[[noreturn]] inline void user_error(const std::string& message) {
  tinker::fail_user(message);
}
[[noreturn]] inline void server_error(const std::string& message) {
  tinker::fail_server(message);
}

/// The messages' text helpers (strings/format.hpp).
using strings::join;
using strings::number_text;
using strings::shape_text;

/// Bytes of one element of `t`.
size_t element_size(dtype t);

/// Product of `shape` when every dim is >= 0 and the product stays <= `cap`; -1 otherwise
/// (negative dim or too large), so a hostile shape cannot overflow.
int64_t checked_numel(const std::vector<int64_t>& shape, int64_t cap);

/// "tinker://" followed by something.
bool tinker_path(const std::string& s);

/// 1-128 of [A-Za-z0-9._-], not starting with '.'.
bool valid_checkpoint_name(const std::string& s);

/// Lower-cased, surrounding spaces removed.
std::string lower_trim(std::string_view s);

// ---- element bytes ---------------------------------------------------------------------------

float bf16_to_float(uint16_t v);
/// Round to nearest even; NaN stays a quiet NaN.
uint16_t float_to_bf16(float f);

template <class T> T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T> void store(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

/// Appends the elements of `bytes` (whole elements of `t`) to `out`'s floats or ints.
void append_elements(dtype t, std::string_view bytes, tinker::tensor_data& out);

/// Appends the elements of `t` in its dtype's byte form.
void append_bytes(const tinker::tensor_data& t, std::string& out);

/// Elements held (floats or ints, by dtype).
size_t element_count(const tinker::tensor_data& t);

/// Little-endian int64 indices; `where` starts the message of a partial element.
std::vector<int64_t> int64_bytes(std::string_view bytes, const std::string& where);

/// Scatters CSR `values` (already in `t.floats` / `t.ints`) into a dense [rows, cols] tensor.
/// Duplicate (row, col) entries add up, as when torch densifies an uncoalesced tensor.
void csr_to_dense(tinker::tensor_data& t, const std::vector<int64_t>& crow,
                  const std::vector<int64_t>& col, const std::string& where,
                  size_t max_dense_bytes);

/// Checks a dense tensor's element count against its shape; an empty shape becomes 1-D.
void settle_shape(tinker::tensor_data& t, bool shape_given, const std::string& where);

// ---- protobuf tensors ------------------------------------------------------------------------

dtype dtype_from_proto(int code, const std::string& where);
tinker_public::DType dtype_to_proto(dtype t);

/// Refuses `bytes` that are not a whole number of `t` elements.
void whole_elements(std::string_view bytes, dtype t, const std::string& where, const char* what);

/// A protobuf Tensor (dense or sparse_csr) as dense tensor data.
tinker::tensor_data tensor_from_proto(const tinker_public::Tensor& p, const std::string& where,
                                      const wire_limits& limits);

/// Parses `msg` from `body`, refusing bodies over the limit or that do not parse.
template <class Message>
void parse_proto(Message& msg, std::string_view body, const std::string& endpoint, const char* type,
                 size_t max_bytes) {
  if (body.size() > max_bytes || body.size() > static_cast<size_t>(INT_MAX))
    user_error(endpoint + ": body of " + std::to_string(body.size()) +
               " bytes exceeds the limit of " +
               std::to_string(std::min<size_t>(max_bytes, INT_MAX)) + " bytes");
  if (!msg.ParseFromArray(body.data(), static_cast<int>(body.size())))
    user_error(endpoint + ": body is not a valid " + type + " protobuf message (" +
               std::to_string(body.size()) + " bytes)");
}

// ---- JSON ------------------------------------------------------------------------------------

/// Parses a body that must be one JSON object.
json parse_object(std::string_view body, const std::string& endpoint);

/// A JSON object being read, with the endpoint and the path of the object for messages.
class fields {
public:
  fields(const json& obj, std::string endpoint, std::string prefix = "")
      : obj_(obj), endpoint_(std::move(endpoint)), prefix_(std::move(prefix)) {}

  /// The field, or nullptr when absent or null (pydantic's exclude_none).
  const json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null())
      return nullptr;
    return &*it;
  }

  std::string where(const char* key) const { return endpoint_ + ": '" + prefix_ + key + "'"; }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    user_error(where(key) + " " + what);
  }

  const json& require(const char* key) const {
    auto* v = get(key);
    if (!v)
      fail(key, "is required");
    return *v;
  }

  void expect(const char* key, const json& v, bool ok, const char* type) const {
    if (!ok)
      fail(key, std::string("must be ") + type + ", got " + v.type_name());
  }

  std::string str(const char* key, bool required, bool non_empty = false) const {
    auto* v = required ? &require(key) : get(key);
    if (!v)
      return {};
    expect(key, *v, v->is_string(), "a string");
    auto s = v->get<std::string>();
    if (non_empty && s.empty())
      fail(key, "must not be empty");
    return s;
  }

  static bool as_int(const json& v, int64_t& out) {
    if (v.is_number_unsigned()) {
      auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return false;
      out = static_cast<int64_t>(u);
      return true;
    }
    if (v.is_number_integer()) {
      out = v.get<int64_t>();
      return true;
    }
    return false;
  }

  int64_t integer(const char* key, bool required, int64_t fallback = 0, bool* has = nullptr,
                  int64_t min = std::numeric_limits<int64_t>::min()) const {
    auto* v = required ? &require(key) : get(key);
    if (has)
      *has = v != nullptr;
    if (!v)
      return fallback;
    int64_t out = 0;
    if (!as_int(*v, out))
      fail(key, std::string("must be an integer in int64 range, got ") +
                    (v->is_number() ? v->dump() : v->type_name()));
    if (out < min)
      fail(key, "must be >= " + std::to_string(min) + ", got " + std::to_string(out));
    return out;
  }

  double number(const char* key, bool required, double fallback = 0) const {
    auto* v = required ? &require(key) : get(key);
    if (!v)
      return fallback;
    expect(key, *v, v->is_number(), "a number");
    return v->get<double>();
  }

  bool boolean(const char* key, bool required, bool fallback = false) const {
    auto* v = required ? &require(key) : get(key);
    if (!v)
      return fallback;
    expect(key, *v, v->is_boolean(), "a boolean");
    return v->get<bool>();
  }

  fields object(const char* key, bool required) const {
    static const json empty = json::object();
    auto* v = required ? &require(key) : get(key);
    if (!v)
      return fields(empty, endpoint_, prefix_ + key + ".");
    expect(key, *v, v->is_object(), "an object");
    return fields(*v, endpoint_, prefix_ + key + ".");
  }

  const json& array(const char* key, bool required) const {
    static const json empty = json::array();
    auto* v = required ? &require(key) : get(key);
    if (!v)
      return empty;
    expect(key, *v, v->is_array(), "an array");
    return *v;
  }

  /// Checks the optional `"type"` discriminator against the accepted names.
  void check_type(std::initializer_list<const char*> accepted) const {
    auto* v = get("type");
    if (!v)
      return;
    expect("type", *v, v->is_string(), "a string");
    auto s = v->get<std::string>();
    for (auto* a : accepted)
      if (s == a)
        return;
    fail("type", "is \"" + s + "\", expected \"" + *accepted.begin() + "\"");
  }

  std::map<std::string, std::string> metadata(const char* key) const {
    std::map<std::string, std::string> out;
    auto* v = get(key);
    if (!v)
      return out;
    expect(key, *v, v->is_object(), "an object");
    for (auto it = v->begin(); it != v->end(); ++it)
      out[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    return out;
  }

  const json& raw() const { return obj_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& prefix() const { return prefix_; }

private:
  const json& obj_;
  std::string endpoint_;
  std::string prefix_;
};

/// Tokens of a JSON ModelInput `{chunks: [{type: "encoded_text", tokens: [...]}]}`.
std::vector<int64_t> model_input_from_json(const fields& f, const char* key);

/// An array of integers (required).
std::vector<int64_t> int_array(const fields& f, const char* key);

/// A JSON TensorData `{data, dtype, shape?, sparse_crow_indices?, sparse_col_indices?}`.
tinker::tensor_data tensor_from_json(const fields& f, const wire_limits& limits);

/// An optional object of numbers.
std::map<std::string, double> number_map(const fields& f, const char* key);

/// Refuses a negative seq_id.
void check_seq_id(const fields& f, int64_t v);

/// The SDK's public JSON dtypes: floats collapse to float32, integers to int64.
const char* public_dtype(dtype t);

/// A float32 value as JSON (null when not finite).
json float_json(double v);

} // namespace rlforge::service::wire_detail
