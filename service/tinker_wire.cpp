#include "service/tinker_wire.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>
#include <zstd.h>

#include "service/tinker.pb.h"

// The wire formats are little-endian; so is every machine rlforge builds for. Element bytes are
// copied with memcpy, so unaligned protobuf byte fields are fine.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tinker_wire assumes a little-endian host");

namespace rlforge::service {

namespace {

using json = nlohmann::json;
using tinker::dtype;
using tinker::request_error;

[[noreturn]] void user_error(const std::string& message) {
  throw request_error("user", message);
}

[[noreturn]] void server_error(const std::string& message) {
  throw request_error("server", message);
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

size_t element_size(dtype t) {
  switch (t) {
  case dtype::float32:
  case dtype::int32:
    return 4;
  case dtype::int64:
    return 8;
  case dtype::bfloat16:
    return 2;
  }
  return 0;
}

/// Product of `shape` when every dim is >= 0 and the product stays <= `cap`; -1 otherwise
/// (negative dim or too large), so a hostile shape cannot overflow.
int64_t checked_numel(const std::vector<int64_t>& shape, int64_t cap) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0)
      return -1;
    if (d != 0 && n > cap / d)
      return -1;
    n *= d;
  }
  return n;
}

bool tinker_path(const std::string& s) {
  return s.rfind("tinker://", 0) == 0 && s.size() > 9;
}

bool valid_checkpoint_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s[0] == '.')
    return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

std::string lower_trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  std::string out(s.substr(b, e - b));
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// ---- element bytes ---------------------------------------------------------------------------

float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f))
    return static_cast<uint16_t>((bits >> 16) | 0x40); // stays a (quiet) NaN
  bits += 0x7fff + ((bits >> 16) & 1);                 // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

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
void append_elements(dtype t, std::string_view bytes, tinker::tensor_data& out) {
  const size_t es = element_size(t);
  const size_t n = bytes.size() / es;
  const char* p = bytes.data();
  if (tinker::is_floating(t))
    out.floats.reserve(out.floats.size() + n);
  else
    out.ints.reserve(out.ints.size() + n);
  for (size_t i = 0; i < n; ++i, p += es) {
    switch (t) {
    case dtype::float32:
      out.floats.push_back(load<float>(p));
      break;
    case dtype::bfloat16:
      out.floats.push_back(bf16_to_float(load<uint16_t>(p)));
      break;
    case dtype::int64:
      out.ints.push_back(load<int64_t>(p));
      break;
    case dtype::int32:
      out.ints.push_back(load<int32_t>(p));
      break;
    }
  }
}

/// Appends the elements of `t` in its dtype's byte form.
void append_bytes(const tinker::tensor_data& t, std::string& out) {
  switch (t.type) {
  case dtype::float32:
    for (double v : t.floats)
      store(out, static_cast<float>(v));
    break;
  case dtype::bfloat16:
    for (double v : t.floats)
      store(out, float_to_bf16(static_cast<float>(v)));
    break;
  case dtype::int64:
    for (int64_t v : t.ints)
      store(out, v);
    break;
  case dtype::int32:
    for (int64_t v : t.ints)
      store(out, static_cast<int32_t>(v));
    break;
  }
}

size_t element_count(const tinker::tensor_data& t) {
  return tinker::is_floating(t.type) ? t.floats.size() : t.ints.size();
}

std::vector<int64_t> int64_bytes(std::string_view bytes, const std::string& where) {
  if (bytes.size() % 8 != 0)
    user_error(where + ": " + std::to_string(bytes.size()) +
               " bytes is not a whole number of int64 indices");
  std::vector<int64_t> out(bytes.size() / 8);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = load<int64_t>(bytes.data() + 8 * i);
  return out;
}

/// Scatters CSR `values` (already in `t.floats` / `t.ints`) into a dense [rows, cols] tensor.
/// Duplicate (row, col) entries add up, as when torch densifies an uncoalesced tensor.
void csr_to_dense(tinker::tensor_data& t, const std::vector<int64_t>& crow,
                  const std::vector<int64_t>& col, const std::string& where,
                  size_t max_dense_bytes) {
  if (t.shape.size() != 2)
    user_error(where + ": a sparse_csr tensor needs a 2-D shape, got " + shape_text(t.shape));
  const int64_t cap = static_cast<int64_t>(max_dense_bytes / element_size(t.type));
  const int64_t numel = checked_numel(t.shape, cap);
  if (numel < 0)
    user_error(where + ": sparse shape " + shape_text(t.shape) +
               " has a negative dimension or exceeds the body limit when dense");
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const size_t nnz = element_count(t);
  if (crow.size() != static_cast<size_t>(rows) + 1)
    user_error(where + ": crow_indices has " + std::to_string(crow.size()) +
               " entries, expected rows + 1 = " + std::to_string(rows + 1));
  if (col.size() != nnz)
    user_error(where + ": col_indices has " + std::to_string(col.size()) +
               " entries but there are " + std::to_string(nnz) + " values");
  if (crow.front() != 0 || crow.back() != static_cast<int64_t>(nnz))
    user_error(where + ": crow_indices must start at 0 and end at the value count " +
               std::to_string(nnz));
  for (int64_t r = 0; r < rows; ++r)
    if (crow[r + 1] < crow[r])
      user_error(where + ": crow_indices decrease at row " + std::to_string(r));
  for (size_t k = 0; k < nnz; ++k)
    if (col[k] < 0 || col[k] >= cols)
      user_error(where + ": col_indices[" + std::to_string(k) + "] = " + std::to_string(col[k]) +
                 " is outside [0, " + std::to_string(cols) + ")");
  const bool floating = tinker::is_floating(t.type);
  std::vector<double> dense_f(floating ? numel : 0, 0.0);
  std::vector<int64_t> dense_i(floating ? 0 : numel, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = crow[r]; k < crow[r + 1]; ++k) {
      const int64_t at = r * cols + col[k];
      if (floating)
        dense_f[at] += t.floats[k];
      else
        dense_i[at] += t.ints[k];
    }
  t.floats = std::move(dense_f);
  t.ints = std::move(dense_i);
}

/// Checks a dense tensor's element count against its shape; an empty shape becomes 1-D.
void settle_shape(tinker::tensor_data& t, bool shape_given, const std::string& where) {
  const size_t n = element_count(t);
  if (!shape_given || t.shape.empty()) {
    t.shape = {static_cast<int64_t>(n)};
    return;
  }
  const int64_t numel = checked_numel(t.shape, std::numeric_limits<int64_t>::max());
  if (numel < 0 || static_cast<size_t>(numel) != n)
    user_error(where + ": shape " + shape_text(t.shape) + " disagrees with its " +
               std::to_string(n) + " elements");
}

// ---- JSON field access -----------------------------------------------------------------------

json parse_object(std::string_view body, const std::string& endpoint) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    user_error(endpoint + ": malformed JSON body: " + e.what());
  }
  if (!j.is_object())
    user_error(endpoint + ": body must be a JSON object, got " + j.type_name());
  return j;
}

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
std::vector<int64_t> model_input_from_json(const fields& f, const char* key) {
  auto input = f.object(key, true);
  const json& chunks = input.array("chunks", true);
  std::vector<int64_t> tokens;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string at = input.prefix() + "chunks[" + std::to_string(c) + "]";
    if (!chunks[c].is_object())
      user_error(f.endpoint() + ": '" + at + "' must be an object, got " + chunks[c].type_name());
    fields chunk(chunks[c], f.endpoint(), at + ".");
    auto type = chunk.str("type", false);
    if (!type.empty() && type != "encoded_text")
      chunk.fail("type",
                 "is \"" + type +
                     "\"; only encoded_text chunks are supported (no image or audio input)");
    const json& toks = chunk.array("tokens", true);
    for (size_t i = 0; i < toks.size(); ++i) {
      int64_t t = 0;
      if (!fields::as_int(toks[i], t))
        user_error(f.endpoint() + ": '" + at + ".tokens[" + std::to_string(i) +
                   "]' must be an integer, got " + toks[i].dump());
      tokens.push_back(t);
    }
  }
  return tokens;
}

std::vector<int64_t> int_array(const fields& f, const char* key) {
  const json& a = f.array(key, true);
  std::vector<int64_t> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t v = 0;
    if (!fields::as_int(a[i], v))
      user_error(f.where(key) + "[" + std::to_string(i) + "] must be an integer, got " +
                 a[i].dump());
    out.push_back(v);
  }
  return out;
}

tinker::tensor_data tensor_from_json(const fields& f, const wire_limits& limits) {
  const std::string where =
      f.endpoint() + ": '" + f.prefix().substr(0, f.prefix().size() - 1) + "'";
  tinker::tensor_data t;
  auto name = f.str("dtype", true);
  try {
    t.type = tinker::parse_dtype(name);
  } catch (const request_error& e) {
    user_error(where + ": " + e.what());
  }
  const json& data = f.array("data", true);
  const bool floating = tinker::is_floating(t.type);
  for (size_t i = 0; i < data.size(); ++i) {
    if (floating) {
      if (!data[i].is_number())
        user_error(where + ": data[" + std::to_string(i) + "] must be a number, got " +
                   data[i].dump());
      // Held at the dtype's precision, as the SDK's numpy arrays and the protobuf form hold it.
      const double v = data[i].get<double>();
      const float f = static_cast<float>(v);
      if (!std::isfinite(f))
        user_error(where + ": data[" + std::to_string(i) + "] = " + number_text(v) +
                   " is outside the float32 range");
      t.floats.push_back(t.type == dtype::bfloat16 ? bf16_to_float(float_to_bf16(f)) : f);
    } else {
      int64_t v = 0;
      if (!fields::as_int(data[i], v))
        user_error(where + ": data[" + std::to_string(i) + "] must be an integer for dtype " +
                   name + ", got " + data[i].dump());
      t.ints.push_back(v);
    }
  }
  const bool shape_given = f.get("shape") != nullptr;
  if (shape_given)
    t.shape = int_array(f, "shape");
  const bool sparse = f.get("sparse_crow_indices") || f.get("sparse_col_indices");
  if (sparse) {
    if (!shape_given)
      user_error(where + ": a sparse tensor needs a shape");
    auto crow = int_array(f, "sparse_crow_indices");
    auto col = int_array(f, "sparse_col_indices");
    csr_to_dense(t, crow, col, where, limits.max_body_bytes);
  } else {
    settle_shape(t, shape_given, where);
  }
  return t;
}

std::map<std::string, double> number_map(const fields& f, const char* key) {
  std::map<std::string, double> out;
  auto* v = f.get(key);
  if (!v)
    return out;
  f.expect(key, *v, v->is_object(), "an object");
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it->is_number())
      user_error(f.where(key) + " entry '" + it.key() + "' must be a number, got " +
                 it->type_name());
    out[it.key()] = it->get<double>();
  }
  return out;
}

void check_seq_id(const fields& f, int64_t v) {
  if (v < 0)
    f.fail("seq_id", "must be >= 0, got " + std::to_string(v));
}

// ---- proto tensors ---------------------------------------------------------------------------

dtype dtype_from_proto(int code, const std::string& where) {
  switch (code) {
  case tinker_public::DTYPE_FLOAT32:
    return dtype::float32;
  case tinker_public::DTYPE_INT64:
    return dtype::int64;
  case tinker_public::DTYPE_INT32:
    return dtype::int32;
  case tinker_public::DTYPE_BFLOAT16:
    return dtype::bfloat16;
  case tinker_public::DTYPE_UNSPECIFIED:
    user_error(where + ": dtype is unspecified (DTYPE_UNSPECIFIED)");
  default:
    user_error(where + ": unknown dtype code " + std::to_string(code) +
               " (expected float32, int64, int32 or bfloat16)");
  }
}

tinker_public::DType dtype_to_proto(dtype t) {
  switch (t) {
  case dtype::float32:
    return tinker_public::DTYPE_FLOAT32;
  case dtype::int64:
    return tinker_public::DTYPE_INT64;
  case dtype::int32:
    return tinker_public::DTYPE_INT32;
  case dtype::bfloat16:
    return tinker_public::DTYPE_BFLOAT16;
  }
  return tinker_public::DTYPE_UNSPECIFIED;
}

void whole_elements(std::string_view bytes, dtype t, const std::string& where, const char* what) {
  if (bytes.size() % element_size(t) != 0)
    user_error(where + ": " + what + " has " + std::to_string(bytes.size()) +
               " bytes, not a whole number of " + tinker::to_string(t) + " elements");
}

tinker::tensor_data tensor_from_proto(const tinker_public::Tensor& p, const std::string& where,
                                      const wire_limits& limits) {
  tinker::tensor_data t;
  t.type = dtype_from_proto(p.dtype(), where);
  t.shape.assign(p.shape().begin(), p.shape().end());
  switch (p.encoding_case()) {
  case tinker_public::Tensor::kDense:
    whole_elements(p.dense(), t.type, where, "dense data");
    append_elements(t.type, p.dense(), t);
    settle_shape(t, true, where);
    break;
  case tinker_public::Tensor::kSparseCsr: {
    const auto& s = p.sparse_csr();
    whole_elements(s.values(), t.type, where, "sparse_csr.values");
    append_elements(t.type, s.values(), t);
    auto crow = int64_bytes(s.crow_indices(), where + ": sparse_csr.crow_indices");
    auto col = int64_bytes(s.col_indices(), where + ": sparse_csr.col_indices");
    csr_to_dense(t, crow, col, where, limits.max_body_bytes);
    break;
  }
  case tinker_public::Tensor::ENCODING_NOT_SET:
    user_error(where + ": tensor has neither dense nor sparse_csr data");
  }
  return t;
}

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

// ---- outputs ---------------------------------------------------------------------------------

struct field_layout {
  dtype type = dtype::float32;
  std::vector<int64_t> trailing;
};

/// Checks the per-datum outputs and metric names; returns each output's dtype and trailing shape.
std::map<std::string, field_layout> check_outputs(const tinker::forward_backward_output& out) {
  for (const auto& [name, v] : out.metrics)
    validate_metric_name(name);
  std::map<std::string, field_layout> layout;
  for (size_t i = 0; i < out.loss_fn_outputs.size(); ++i) {
    const auto& datum = out.loss_fn_outputs[i];
    const std::string at = "forward_backward output: datum " + std::to_string(i);
    if (i > 0 && datum.size() != layout.size())
      server_error(at + " has " + std::to_string(datum.size()) + " outputs, datum 0 has " +
                   std::to_string(layout.size()));
    for (const auto& [name, t] : datum) {
      const int64_t numel = checked_numel(t.shape, std::numeric_limits<int64_t>::max());
      if (numel < 0 || static_cast<size_t>(numel) != element_count(t))
        server_error(at + " output '" + name + "': shape " + shape_text(t.shape) +
                     " disagrees with " + std::to_string(element_count(t)) + " elements");
      field_layout l;
      l.type = t.type;
      if (t.shape.size() > 1)
        l.trailing.assign(t.shape.begin() + 1, t.shape.end());
      if (i == 0) {
        layout[name] = l;
        continue;
      }
      auto it = layout.find(name);
      if (it == layout.end())
        server_error(at + " has output '" + name + "' that datum 0 lacks");
      if (it->second.type != l.type || it->second.trailing != l.trailing)
        server_error(at + " output '" + name + "' is " + tinker::to_string(l.type) + " " +
                     shape_text(t.shape) + ", unlike datum 0 (" +
                     tinker::to_string(it->second.type) + ", trailing shape " +
                     shape_text(it->second.trailing) + ")");
    }
  }
  return layout;
}

tinker_public::StopReason stop_reason_to_proto(const std::string& s, size_t i) {
  if (s == "stop")
    return tinker_public::STOP_REASON_STOP;
  if (s == "length")
    return tinker_public::STOP_REASON_LENGTH;
  server_error("sample response: sequence " + std::to_string(i) + " has stop_reason \"" + s +
               "\" (expected stop or length)");
}

void check_sequences(const tinker::sample_response& r) {
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const auto& s = r.sequences[i];
    stop_reason_to_proto(s.stop_reason, i);
    if (s.logprobs.size() != s.tokens.size())
      server_error("sample response: sequence " + std::to_string(i) + " has " +
                   std::to_string(s.logprobs.size()) + " logprobs for " +
                   std::to_string(s.tokens.size()) + " tokens");
    for (auto t : s.tokens)
      if (t < std::numeric_limits<int32_t>::min() || t > std::numeric_limits<int32_t>::max())
        server_error("sample response: sequence " + std::to_string(i) + " token " +
                     std::to_string(t) + " does not fit in int32");
  }
}

/// The SDK's public JSON dtypes: floats collapse to float32, integers to int64.
const char* public_dtype(dtype t) {
  return tinker::is_floating(t) ? "float32" : "int64";
}

json float_json(double v) {
  return std::isfinite(v) ? json(static_cast<double>(static_cast<float>(v))) : json(nullptr);
}

const std::map<std::string, std::vector<std::string>>& loss_keys() {
  static const std::map<std::string, std::vector<std::string>> keys = {
      {"cross_entropy", {}},
      {"importance_sampling", {}},
      {"ppo", {"clip_high_threshold", "clip_low_threshold", "value_clip"}},
      {"gspo", {"clip_high_threshold", "clip_low_threshold"}},
      {"cispo", {"clip_high_threshold", "clip_low_threshold"}},
      {"dppo", {"delta_high", "delta_low"}},
      {"dro", {"beta"}},
      {"ppo_critic", {"value_clip"}},
  };
  return keys;
}

} // namespace

// ---- compression -----------------------------------------------------------------------------

std::string zstd_decompress(std::string_view compressed, size_t max_output_bytes) {
  if (compressed.empty())
    user_error("zstd: empty body is not a zstd frame");
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx)
    server_error("zstd: cannot allocate a decompression context");
  // Encoders shrink a frame's window to its content size, so a window beyond twice the largest
  // allowed output only makes the decoder reserve memory for nothing: refuse such frames.
  int window_log = 10;
  while (window_log < 27 && (size_t{1} << window_log) / 2 < max_output_bytes)
    ++window_log;
  ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax, window_log);
  std::string out;
  std::string buffer(ZSTD_DStreamOutSize(), '\0');
  ZSTD_inBuffer in{compressed.data(), compressed.size(), 0};
  for (;;) {
    const size_t consumed = in.pos;
    ZSTD_outBuffer ob{buffer.data(), buffer.size(), 0};
    const size_t ret = ZSTD_decompressStream(ctx.get(), &ob, &in);
    if (ZSTD_isError(ret))
      user_error(std::string("zstd: corrupt or unsupported data: ") + ZSTD_getErrorName(ret));
    if (ob.pos > max_output_bytes - std::min(out.size(), max_output_bytes))
      user_error("zstd: decompressed body exceeds the limit of " +
                 std::to_string(max_output_bytes) + " bytes");
    out.append(buffer.data(), ob.pos);
    if (ret == 0 && in.pos == in.size)
      return out; // the last frame is complete and flushed
    // The decoder wants more input than there is: the frame was cut short.
    if (in.pos == in.size && in.pos == consumed && ob.pos == 0)
      user_error("zstd: truncated frame (" + std::to_string(compressed.size()) + " bytes)");
  }
}

std::string zstd_compress(std::string_view data, int level) {
  if (level < 1 || level > 19)
    server_error("zstd: compression level " + std::to_string(level) + " is outside 1..19");
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), level);
  if (ZSTD_isError(n))
    server_error(std::string("zstd: compression failed: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

std::string decode_content(std::string_view body, std::string_view content_encoding,
                           size_t max_output_bytes) {
  const auto enc = lower_trim(content_encoding);
  if (enc == "zstd")
    return zstd_decompress(body, max_output_bytes);
  if (!enc.empty() && enc != "identity")
    user_error("unsupported Content-Encoding \"" + std::string(content_encoding) +
               "\" (accepted: identity, zstd)");
  if (body.size() > max_output_bytes)
    user_error("body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
               std::to_string(max_output_bytes) + " bytes");
  return std::string(body);
}

// ---- forward_backward ------------------------------------------------------------------------

const std::vector<std::string>& loss_input_names() {
  static const std::vector<std::string> names = {"target_tokens", "weights", "logprobs",
                                                 "advantages",    "values",  "returns"};
  return names;
}

void normalize_loss_inputs(tinker::datum& d) {
  for (auto& [name, t] : d.loss_fn_inputs) {
    if (name == "target_tokens" || tinker::is_floating(t.type))
      continue;
    t.floats.clear();
    for (auto v : t.ints)
      t.floats.push_back(static_cast<float>(v));
    t.ints.clear();
    t.type = dtype::float32;
  }
}

void validate_forward_backward(const tinker::forward_backward_request& r,
                               const wire_limits& limits) {
  const std::string ep = "forward_backward: ";
  if (r.model_id.empty())
    user_error(ep + "'model_id' is required");
  if (r.seq_id < 0)
    user_error(ep + "'seq_id' must be >= 0, got " + std::to_string(r.seq_id));
  try {
    validate_loss_config(r.loss_fn, r.loss_fn_config);
  } catch (const request_error& e) {
    user_error(ep + e.what());
  }
  if (r.data.empty())
    user_error(ep + "'data' is empty; send at least one datum");
  std::vector<std::string> needed = {"target_tokens"};
  const auto& loss = r.loss_fn;
  const bool policy_gradient = loss == "importance_sampling" || loss == "cispo" || loss == "dro" ||
                               loss == "gspo" || loss == "dppo";
  if (policy_gradient)
    needed.insert(needed.end(), {"logprobs", "advantages"});
  // A critic's loss needs the returns and the value predictions of the rollout (`values`, the
  // old values its clip is measured from).
  if (loss == "ppo_critic")
    needed.insert(needed.end(), {"returns", "values"});
  const auto& known = loss_input_names();
  for (size_t i = 0; i < r.data.size(); ++i) {
    const auto& d = r.data[i];
    const std::string at = ep + "data[" + std::to_string(i) + "]";
    if (d.tokens.empty())
      user_error(at + ": model_input has no tokens");
    if (limits.max_context_length > 0 &&
        static_cast<int64_t>(d.tokens.size()) >= limits.max_context_length)
      user_error(at + ": model_input has " + std::to_string(d.tokens.size()) +
                 " tokens; the model's context holds " + std::to_string(limits.max_context_length) +
                 " (input + 1 target) at most");
    for (size_t k = 0; k < d.tokens.size(); ++k) {
      const auto tok = d.tokens[k];
      if (tok < 0 || (limits.vocab_size > 0 && tok >= limits.vocab_size))
        user_error(at + ": model_input token " + std::to_string(k) + " = " + std::to_string(tok) +
                   (tok < 0
                        ? " is negative"
                        : " is outside the vocabulary of " + std::to_string(limits.vocab_size)));
    }
    auto needs = needed;
    if (loss == "ppo") {
      const bool critic = d.loss_fn_inputs.count("returns") > 0;
      if (critic)
        needs.insert(needs.end(), {"returns", "values"});
      else
        needs.insert(needs.end(), {"logprobs", "advantages"});
    }
    for (const auto& n : needs)
      if (!d.loss_fn_inputs.count(n))
        user_error(at + ": loss_fn_inputs lacks '" + n + "', which loss '" + loss + "' needs");
    const auto L = static_cast<int64_t>(d.tokens.size());
    for (const auto& [name, t] : d.loss_fn_inputs) {
      const std::string in = at + ".loss_fn_inputs." + name;
      if (std::find(known.begin(), known.end(), name) == known.end())
        user_error(at + ": unknown loss_fn_inputs entry '" + name + "'; accepted: " + join(known));
      const bool is_target = name == "target_tokens";
      if (is_target == tinker::is_floating(t.type))
        user_error(in + ": dtype " + tinker::to_string(t.type) + " is not accepted (expected " +
                   (is_target ? "int64 or int32" : "float32 or bfloat16") + ")");
      const int64_t numel = checked_numel(t.shape, std::numeric_limits<int64_t>::max());
      if (numel < 0 || static_cast<size_t>(numel) != element_count(t))
        user_error(in + ": shape " + shape_text(t.shape) + " disagrees with its " +
                   std::to_string(element_count(t)) + " elements");
      if (t.shape.size() != 1 || t.shape[0] != L)
        user_error(in + ": shape " + shape_text(t.shape) + " must be [" + std::to_string(L) +
                   "], one value per model_input token");
      for (size_t k = 0; k < t.ints.size(); ++k) {
        const auto v = t.ints[k];
        if (v < 0 || (limits.vocab_size > 0 && v >= limits.vocab_size))
          user_error(in + "[" + std::to_string(k) + "] = " + std::to_string(v) +
                     (v < 0
                          ? " is a negative token id"
                          : " is outside the vocabulary of " + std::to_string(limits.vocab_size)));
      }
      for (size_t k = 0; k < t.floats.size(); ++k) {
        const auto v = t.floats[k];
        if (!std::isfinite(v))
          user_error(in + "[" + std::to_string(k) + "] is not finite (" + number_text(v) + ")");
        if (name == "weights" && v < 0)
          user_error(in + "[" + std::to_string(k) + "] = " + number_text(v) +
                     " is negative; weights must be >= 0");
      }
    }
  }
}

tinker::tensor_data decode_tensor_proto(std::string_view tensor_message, const std::string& where,
                                        const wire_limits& limits) {
  tinker_public::Tensor msg;
  parse_proto(msg, tensor_message, where, "Tensor", limits.max_body_bytes);
  return tensor_from_proto(msg, where, limits);
}

tinker::forward_backward_request decode_forward_backward_proto(std::string_view body,
                                                               const wire_limits& limits) {
  const std::string ep = "forward_backward";
  tinker_public::ForwardBackwardRequest msg;
  parse_proto(msg, body, ep, "ForwardBackwardRequest", limits.max_body_bytes);
  tinker::forward_backward_request r;
  r.model_id = msg.model_id();
  r.seq_id = msg.seq_id();
  r.loss_fn = msg.loss_fn();
  r.forward_only = msg.forward_only();
  r.loss_fn_config.insert(msg.loss_fn_config().begin(), msg.loss_fn_config().end());
  r.data.reserve(msg.data_size());
  for (int i = 0; i < msg.data_size(); ++i) {
    const auto& pd = msg.data(i);
    const std::string at = ep + ": data[" + std::to_string(i) + "]";
    tinker::datum d;
    for (int c = 0; c < pd.model_input_size(); ++c) {
      const auto& chunk = pd.model_input(c);
      const std::string where = at + ".model_input[" + std::to_string(c) + "]";
      switch (chunk.chunk_case()) {
      case tinker_public::Chunk::kEncodedText: {
        const auto& bytes = chunk.encoded_text().tokens();
        if (bytes.size() % 4 != 0)
          user_error(where + ": encoded_text has " + std::to_string(bytes.size()) +
                     " token bytes, not a whole number of int32 tokens");
        for (size_t k = 0; k < bytes.size(); k += 4)
          d.tokens.push_back(load<int32_t>(bytes.data() + k));
        break;
      }
      case tinker_public::Chunk::kImage:
        user_error(where + " is an image chunk; only encoded_text chunks are supported");
      case tinker_public::Chunk::kDmel:
        user_error(where + " is a dmel (audio) chunk; only encoded_text chunks are supported");
      case tinker_public::Chunk::CHUNK_NOT_SET:
        user_error(where + " is empty (no encoded_text)");
      }
    }
    for (const auto& [name, tensor] : pd.loss_fn_inputs())
      d.loss_fn_inputs[name] = tensor_from_proto(tensor, at + ".loss_fn_inputs." + name, limits);
    normalize_loss_inputs(d);
    r.data.push_back(std::move(d));
  }
  validate_forward_backward(r, limits);
  return r;
}

tinker::forward_backward_request decode_forward_backward_json(std::string_view body,
                                                              const wire_limits& limits) {
  const std::string ep = "forward_backward";
  if (body.size() > limits.max_body_bytes)
    user_error(ep + ": body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
               std::to_string(limits.max_body_bytes) + " bytes");
  const json j = parse_object(body, ep);
  fields top(j, ep);
  top.check_type({"forward_backward", "forward"});
  tinker::forward_backward_request r;
  r.model_id = top.str("model_id", true, true);
  r.seq_id = top.integer("seq_id", true);
  check_seq_id(top, r.seq_id);
  const bool fb = top.get("forward_backward_input") != nullptr;
  const bool fwd = top.get("forward_input") != nullptr;
  if (fb == fwd)
    user_error(ep + ": exactly one of 'forward_backward_input' and 'forward_input' is required");
  r.forward_only = fwd || top.boolean("forward_only", false);
  auto input = top.object(fb ? "forward_backward_input" : "forward_input", true);
  r.loss_fn = input.str("loss_fn", true, true);
  r.loss_fn_config = number_map(input, "loss_fn_config");
  const json& data = input.array("data", true);
  r.data.reserve(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const std::string at = "data[" + std::to_string(i) + "]";
    if (!data[i].is_object())
      user_error(ep + ": '" + at + "' must be an object, got " + data[i].type_name());
    fields df(data[i], ep, at + ".");
    tinker::datum d;
    d.tokens = model_input_from_json(df, "model_input");
    auto inputs = df.object("loss_fn_inputs", false);
    for (auto it = inputs.raw().begin(); it != inputs.raw().end(); ++it) {
      const std::string name = it.key();
      if (!it->is_object())
        user_error(inputs.where(name.c_str()) + " must be an object (TensorData), got " +
                   it->type_name());
      fields tf(*it, ep, inputs.prefix() + name + ".");
      d.loss_fn_inputs[name] = tensor_from_json(tf, limits);
    }
    normalize_loss_inputs(d);
    r.data.push_back(std::move(d));
  }
  validate_forward_backward(r, limits);
  return r;
}

tinker::forward_backward_request decode_forward_backward(std::string_view body,
                                                         std::string_view content_type,
                                                         std::string_view content_encoding,
                                                         const wire_limits& limits) {
  const auto type = lower_trim(content_type.substr(0, content_type.find(';')));
  if (type != "application/x-protobuf" && type != "application/protobuf" &&
      type != "application/json" && !type.empty())
    user_error("forward_backward: unsupported Content-Type \"" + std::string(content_type) +
               "\" (accepted: application/x-protobuf, application/json)");
  std::string plain;
  try {
    plain = decode_content(body, content_encoding, limits.max_body_bytes);
  } catch (const request_error& e) {
    user_error(std::string("forward_backward: ") + e.what());
  }
  if (type == "application/x-protobuf" || type == "application/protobuf")
    return decode_forward_backward_proto(plain, limits);
  return decode_forward_backward_json(plain, limits);
}

std::string encode_forward_backward_request_proto(const tinker::forward_backward_request& r) {
  if (r.seq_id < std::numeric_limits<int32_t>::min() ||
      r.seq_id > std::numeric_limits<int32_t>::max())
    user_error("forward_backward request: seq_id " + std::to_string(r.seq_id) +
               " does not fit the protobuf int32 field");
  tinker_public::ForwardBackwardRequest msg;
  msg.set_model_id(r.model_id);
  msg.set_seq_id(static_cast<int32_t>(r.seq_id));
  msg.set_loss_fn(r.loss_fn);
  msg.set_forward_only(r.forward_only);
  for (const auto& [k, v] : r.loss_fn_config)
    (*msg.mutable_loss_fn_config())[k] = v;
  for (size_t i = 0; i < r.data.size(); ++i) {
    const auto& d = r.data[i];
    auto* pd = msg.add_data();
    std::string tokens;
    for (auto t : d.tokens) {
      if (t < std::numeric_limits<int32_t>::min() || t > std::numeric_limits<int32_t>::max())
        user_error("forward_backward request: data[" + std::to_string(i) + "] token " +
                   std::to_string(t) + " does not fit in int32");
      store(tokens, static_cast<int32_t>(t));
    }
    pd->add_model_input()->mutable_encoded_text()->set_tokens(std::move(tokens));
    for (const auto& [name, t] : d.loss_fn_inputs) {
      tinker_public::Tensor pt;
      pt.set_dtype(dtype_to_proto(t.type));
      for (auto s : t.shape)
        pt.add_shape(s);
      std::string bytes;
      append_bytes(t, bytes);
      pt.set_dense(std::move(bytes));
      (*pd->mutable_loss_fn_inputs())[name] = std::move(pt);
    }
  }
  return msg.SerializeAsString();
}

void validate_metric_name(const std::string& name) {
  static const std::set<std::string> reductions = {"mean",  "sum",    "min",           "max",
                                                   "slack", "unique", "hash_unordered"};
  const auto colon = name.find(':');
  if (colon == std::string::npos || colon == 0 || name.find(':', colon + 1) != std::string::npos ||
      !reductions.count(name.substr(colon + 1)))
    server_error("metric name \"" + name +
                 "\" is not \"<name>:<reduction>\" with one colon and a reduction among mean, "
                 "sum, min, max, slack, hash_unordered, unique");
}

std::string encode_forward_backward_output_proto(const tinker::forward_backward_output& out) {
  const auto layout = check_outputs(out);
  tinker_public::ForwardBackwardOutput msg;
  msg.set_loss_fn_output_type(out.loss_fn_output_type);
  for (const auto& [k, v] : out.metrics)
    (*msg.mutable_metrics())[k] = v;
  auto* record = msg.add_loss_fn_outputs();
  record->set_type_tag("ArrayRecord");
  record->set_num_datums(static_cast<int64_t>(out.loss_fn_outputs.size()));
  for (const auto& [name, l] : layout) {
    tinker_public::BatchedTensor bt;
    bt.set_dtype(dtype_to_proto(l.type));
    for (auto s : l.trailing)
      bt.add_trailing_shape(s);
    std::string data, offsets;
    store<int64_t>(offsets, 0);
    for (const auto& datum : out.loss_fn_outputs) {
      append_bytes(datum.at(name), data);
      store(offsets, static_cast<int64_t>(data.size()));
    }
    bt.set_data(std::move(data));
    bt.set_offsets(std::move(offsets));
    (*record->mutable_fields())[name] = std::move(bt);
  }
  return msg.SerializeAsString();
}

tinker::forward_backward_output decode_forward_backward_output_proto(std::string_view body) {
  const std::string ep = "ForwardBackwardOutput";
  tinker_public::ForwardBackwardOutput msg;
  parse_proto(msg, body, ep, "ForwardBackwardOutput", static_cast<size_t>(INT_MAX));
  tinker::forward_backward_output out;
  out.loss_fn_output_type = msg.loss_fn_output_type();
  out.metrics.insert(msg.metrics().begin(), msg.metrics().end());
  for (int r = 0; r < msg.loss_fn_outputs_size(); ++r) {
    const auto& rec = msg.loss_fn_outputs(r);
    const size_t base = out.loss_fn_outputs.size();
    int64_t count = rec.num_datums();
    if (count == 0 && !rec.fields().empty())
      count = static_cast<int64_t>(rec.fields().begin()->second.offsets().size() / 8) - 1;
    if (count < 0 || count > static_cast<int64_t>(body.size()) + 1)
      user_error(ep + ": record " + std::to_string(r) + " has an invalid datum count " +
                 std::to_string(count));
    out.loss_fn_outputs.resize(base + static_cast<size_t>(count));
    for (const auto& [name, bt] : rec.fields()) {
      const std::string where = ep + ": field '" + name + "'";
      const dtype t = dtype_from_proto(bt.dtype(), where);
      const size_t es = element_size(t);
      auto offsets = int64_bytes(bt.offsets(), where + " offsets");
      if (offsets.size() != static_cast<size_t>(count) + 1)
        user_error(where + ": " + std::to_string(offsets.size()) + " offsets for " +
                   std::to_string(count) + " datums");
      std::vector<int64_t> trailing(bt.trailing_shape().begin(), bt.trailing_shape().end());
      const int64_t per_row = checked_numel(trailing, std::numeric_limits<int32_t>::max());
      if (per_row < 0)
        user_error(where + ": invalid trailing_shape " + shape_text(trailing));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t b = offsets[i], e = offsets[i + 1];
        if (b < 0 || e < b || e > static_cast<int64_t>(bt.data().size()) || b % es || e % es)
          user_error(where + ": offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                     ") of datum " + std::to_string(i) + " are outside the " +
                     std::to_string(bt.data().size()) + " data bytes or not element-aligned");
        tinker::tensor_data td;
        td.type = t;
        append_elements(t, std::string_view(bt.data()).substr(b, e - b), td);
        const auto n = static_cast<int64_t>(element_count(td));
        if (per_row == 0 ? n != 0 : n % per_row != 0)
          user_error(where + ": datum " + std::to_string(i) + " has " + std::to_string(n) +
                     " elements, not a multiple of trailing_shape " + shape_text(trailing));
        td.shape = {per_row == 0 ? 0 : n / per_row};
        td.shape.insert(td.shape.end(), trailing.begin(), trailing.end());
        out.loss_fn_outputs[base + i][name] = std::move(td);
      }
    }
  }
  return out;
}

std::string encode_forward_backward_output_json(const tinker::forward_backward_output& out) {
  check_outputs(out);
  json j;
  j["loss_fn_output_type"] = out.loss_fn_output_type;
  j["loss_fn_outputs"] = json::array();
  for (const auto& datum : out.loss_fn_outputs) {
    json d = json::object();
    for (const auto& [name, t] : datum) {
      json data = json::array();
      if (tinker::is_floating(t.type))
        for (double v : t.floats)
          data.push_back(float_json(v));
      else
        for (int64_t v : t.ints)
          data.push_back(v);
      d[name] = {{"data", std::move(data)}, {"dtype", public_dtype(t.type)}, {"shape", t.shape}};
    }
    j["loss_fn_outputs"].push_back(std::move(d));
  }
  json metrics = json::object();
  for (const auto& [k, v] : out.metrics)
    metrics[k] = std::isfinite(v) ? json(v) : json(nullptr);
  j["metrics"] = std::move(metrics);
  return j.dump();
}

// ---- losses ----------------------------------------------------------------------------------

const std::vector<std::string>& loss_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, keys] : loss_keys())
      out.push_back(name);
    return out;
  }();
  return names;
}

std::vector<std::string> loss_config_keys(const std::string& loss_fn) {
  auto it = loss_keys().find(loss_fn);
  if (it == loss_keys().end())
    user_error("unknown loss_fn '" + loss_fn + "'; accepted: " + join(loss_names()));
  return it->second;
}

void validate_loss_config(const std::string& loss_fn, const std::map<std::string, double>& config) {
  const auto keys = loss_config_keys(loss_fn);
  const std::string what = "loss '" + loss_fn + "': loss_fn_config key '";
  for (const auto& entry : config) {
    // Named copies, not structured bindings: lambdas may not capture those before C++20.
    const std::string& key = entry.first;
    const double v = entry.second;
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      user_error("loss '" + loss_fn + "': unknown loss_fn_config key '" + key +
                 "'; allowed keys: " + join(keys));
    auto bad = [&](const char* domain) {
      user_error(what + key + "' must be " + domain + ", got " + number_text(v));
    };
    if (std::isnan(v))
      bad("a number");
    if (key == "clip_low_threshold") {
      if (!(v >= 0.0 && v <= 1.0))
        bad("in [0, 1]");
    } else if (key == "clip_high_threshold") {
      if (!std::isfinite(v) || v < 1.0)
        bad("a finite number >= 1");
    } else if (key == "value_clip") {
      if (v < 0.0)
        bad("a number >= 0 (inf disables clipping)");
    } else if (!std::isfinite(v) || v < 0.0) { // beta, delta_low, delta_high
      bad("a finite number >= 0");
    }
  }
  if (loss_fn == "dro" && !config.count("beta"))
    user_error("loss 'dro': loss_fn_config key 'beta' is required");
}

std::map<std::string, double> ppo_to_regular(const std::map<std::string, double>& config) {
  validate_loss_config("ppo", config);
  auto get = [&](const char* key, double fallback) {
    auto it = config.find(key);
    return it == config.end() ? fallback : it->second;
  };
  return {{"eps_clip_low", 1.0 - get("clip_low_threshold", 0.8)},
          {"eps_clip_high", get("clip_high_threshold", 1.2) - 1.0}};
}

// ---- sampling --------------------------------------------------------------------------------

sample_body decode_sample(std::string_view body, const wire_limits& limits) {
  const std::string ep = "asample";
  if (body.size() > limits.max_body_bytes)
    user_error(ep + ": body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
               std::to_string(limits.max_body_bytes) + " bytes");
  const json j = parse_object(body, ep);
  fields f(j, ep);
  f.check_type({"sample"});
  sample_body out;
  auto& r = out.request;
  r.sampling_session_id = f.str("sampling_session_id", false);
  out.model_path = f.str("model_path", false);
  out.base_model = f.str("base_model", false);
  if (r.sampling_session_id.empty() && out.model_path.empty() && out.base_model.empty())
    user_error(ep + ": one of 'sampling_session_id', 'model_path' or 'base_model' is required");
  if (!out.model_path.empty() && !tinker_path(out.model_path))
    f.fail("model_path", "must start with tinker://, got \"" + out.model_path + "\"");
  bool has_seq = false;
  r.seq_id = f.integer("seq_id", false, 0, &has_seq, 0);
  if (!r.sampling_session_id.empty() && !has_seq)
    f.fail("seq_id", "is required with a sampling_session_id");
  r.num_samples = f.integer("num_samples", false, 1);
  if (r.num_samples < 1)
    f.fail("num_samples", "must be >= 1, got " + std::to_string(r.num_samples));
  r.prompt = model_input_from_json(f, "prompt");
  if (r.prompt.empty())
    f.fail("prompt", "has no tokens");
  for (size_t k = 0; k < r.prompt.size(); ++k) {
    const auto t = r.prompt[k];
    if (t < 0 || (limits.vocab_size > 0 && t >= limits.vocab_size))
      user_error(f.where("prompt") + " token " + std::to_string(k) + " = " + std::to_string(t) +
                 (t < 0 ? " is negative"
                        : " is outside the vocabulary of " + std::to_string(limits.vocab_size)));
  }
  if (limits.max_context_length > 0 &&
      static_cast<int64_t>(r.prompt.size()) >= limits.max_context_length)
    f.fail("prompt", "has " + std::to_string(r.prompt.size()) +
                         " tokens; it must be shorter than the model's context of " +
                         std::to_string(limits.max_context_length));
  auto sp = f.object("sampling_params", true);
  auto& p = r.params;
  bool has_max = false;
  p.max_tokens = sp.integer("max_tokens", false, 0, &has_max);
  if (!has_max)
    sp.fail("max_tokens", "is required");
  if (p.max_tokens < 1)
    sp.fail("max_tokens", "must be >= 1, got " + std::to_string(p.max_tokens));
  p.seed = sp.integer("seed", false, 0, &p.has_seed);
  p.temperature = sp.number("temperature", false, 1.0);
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    sp.fail("temperature", "must be a finite number >= 0, got " + number_text(p.temperature));
  p.top_p = sp.number("top_p", false, 1.0);
  if (!(p.top_p > 0 && p.top_p <= 1))
    sp.fail("top_p", "must be in (0, 1], got " + number_text(p.top_p));
  p.top_k = sp.integer("top_k", false, -1);
  if (p.top_k == 0)
    p.top_k = -1;
  if (p.top_k < -1)
    sp.fail("top_k", "must be -1 (off) or >= 1, got " + std::to_string(p.top_k));
  if (auto* stop = sp.get("stop")) {
    if (stop->is_string()) {
      p.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      bool strings = false, ints = false;
      for (size_t i = 0; i < stop->size(); ++i) {
        const auto& s = (*stop)[i];
        int64_t tok = 0;
        if (s.is_string()) {
          strings = true;
          p.stop_strings.push_back(s.get<std::string>());
        } else if (fields::as_int(s, tok)) {
          ints = true;
          if (tok < 0)
            sp.fail("stop",
                    "token " + std::to_string(i) + " = " + std::to_string(tok) + " is negative");
          p.stop_tokens.push_back(tok);
        } else {
          sp.fail("stop", "entry " + std::to_string(i) + " must be a string or an integer, got " +
                              s.type_name());
        }
      }
      if (strings && ints)
        sp.fail("stop", "mixes strings and token ids; send one kind");
    } else {
      sp.fail("stop", std::string("must be a string or an array, got ") + stop->type_name());
    }
  }
  r.prompt_logprobs = f.boolean("prompt_logprobs", false);
  r.topk_prompt_logprobs = f.integer("topk_prompt_logprobs", false, 0, nullptr, 0);
  if (r.topk_prompt_logprobs > 0)
    f.fail("topk_prompt_logprobs", "= " + std::to_string(r.topk_prompt_logprobs) +
                                       " is not supported by this server (send 0)");
  return out;
}

std::string encode_sample_response_proto(const tinker::sample_response& r) {
  check_sequences(r);
  tinker_public::SampleResponse msg;
  for (size_t i = 0; i < r.sequences.size(); ++i) {
    const auto& s = r.sequences[i];
    auto* ps = msg.add_sequences();
    ps->set_stop_reason(stop_reason_to_proto(s.stop_reason, i));
    std::string tokens, logprobs;
    for (auto t : s.tokens)
      store(tokens, static_cast<int32_t>(t));
    for (auto v : s.logprobs)
      store(logprobs, static_cast<float>(v));
    ps->set_tokens(std::move(tokens));
    ps->set_logprobs(std::move(logprobs));
  }
  if (r.has_prompt_logprobs) {
    std::string bytes;
    for (size_t k = 0; k < r.prompt_logprobs.size(); ++k)
      store(bytes, k == 0 ? std::numeric_limits<float>::quiet_NaN()
                          : static_cast<float>(r.prompt_logprobs[k]));
    msg.set_prompt_logprobs(std::move(bytes));
  }
  return msg.SerializeAsString();
}

tinker::sample_response decode_sample_response_proto(std::string_view body) {
  const std::string ep = "SampleResponse";
  tinker_public::SampleResponse msg;
  parse_proto(msg, body, ep, "SampleResponse", static_cast<size_t>(INT_MAX));
  tinker::sample_response out;
  for (int i = 0; i < msg.sequences_size(); ++i) {
    const auto& ps = msg.sequences(i);
    const std::string where = ep + ": sequence " + std::to_string(i);
    tinker::sampled_sequence s;
    if (ps.stop_reason() == tinker_public::STOP_REASON_STOP)
      s.stop_reason = "stop";
    else if (ps.stop_reason() == tinker_public::STOP_REASON_LENGTH)
      s.stop_reason = "length";
    else
      user_error(where + ": unknown stop_reason " + std::to_string(ps.stop_reason()));
    whole_elements(ps.tokens(), dtype::int32, where, "tokens");
    tinker::tensor_data t;
    t.type = dtype::int32;
    append_elements(dtype::int32, ps.tokens(), t);
    s.tokens = std::move(t.ints);
    whole_elements(ps.logprobs(), dtype::float32, where, "logprobs");
    tinker::tensor_data lp;
    append_elements(dtype::float32, ps.logprobs(), lp);
    s.logprobs = std::move(lp.floats);
    out.sequences.push_back(std::move(s));
  }
  if (msg.has_prompt_logprobs()) {
    whole_elements(msg.prompt_logprobs(), dtype::float32, ep, "prompt_logprobs");
    tinker::tensor_data lp;
    append_elements(dtype::float32, msg.prompt_logprobs(), lp);
    out.has_prompt_logprobs = true;
    out.prompt_logprobs = std::move(lp.floats);
  }
  return out;
}

std::string encode_sample_response_json(const tinker::sample_response& r) {
  check_sequences(r);
  json j;
  j["sequences"] = json::array();
  for (const auto& s : r.sequences) {
    json lp = json::array();
    for (auto v : s.logprobs)
      lp.push_back(float_json(v));
    j["sequences"].push_back(
        {{"stop_reason", s.stop_reason}, {"tokens", s.tokens}, {"logprobs", std::move(lp)}});
  }
  if (r.has_prompt_logprobs) {
    json lp = json::array();
    for (size_t k = 0; k < r.prompt_logprobs.size(); ++k)
      lp.push_back(k == 0 ? json(nullptr) : float_json(r.prompt_logprobs[k]));
    j["prompt_logprobs"] = std::move(lp);
  }
  j["type"] = "sample";
  return j.dump();
}

// ---- the other JSON bodies -------------------------------------------------------------------

create_session_request decode_create_session(std::string_view body) {
  const json j = parse_object(body, "create_session");
  fields f(j, "create_session");
  f.check_type({"create_session"});
  create_session_request r;
  const json& tags = f.array("tags", false);
  for (size_t i = 0; i < tags.size(); ++i) {
    if (!tags[i].is_string())
      f.fail("tags",
             "entry " + std::to_string(i) + " must be a string, got " + tags[i].type_name());
    r.tags.push_back(tags[i].get<std::string>());
  }
  r.user_metadata = f.metadata("user_metadata");
  r.sdk_version = f.str("sdk_version", false);
  r.project_id = f.str("project_id", false);
  return r;
}

session_heartbeat_request decode_session_heartbeat(std::string_view body) {
  const json j = parse_object(body, "session_heartbeat");
  fields f(j, "session_heartbeat");
  f.check_type({"session_heartbeat"});
  return {f.str("session_id", true, true)};
}

create_model_request decode_create_model(std::string_view body) {
  const json j = parse_object(body, "create_model");
  fields f(j, "create_model");
  f.check_type({"create_model"});
  create_model_request r;
  r.session_id = f.str("session_id", true, true);
  r.model_seq_id = f.integer("model_seq_id", true, 0, nullptr, 0);
  r.base_model = f.str("base_model", true, true);
  r.user_metadata = f.metadata("user_metadata");
  if (f.get("lora_config")) {
    auto l = f.object("lora_config", true);
    r.lora.rank = l.integer("rank", true, 0, nullptr, 0);
    r.lora.seed = l.integer("seed", false, 0, &r.lora.has_seed);
    r.lora.train_unembed = l.boolean("train_unembed", false, true);
    r.lora.train_mlp = l.boolean("train_mlp", false, true);
    r.lora.train_attn = l.boolean("train_attn", false, true);
  }
  auto role = f.str("model_role", false);
  if (!role.empty()) {
    if (role != "policy" && role != "critic")
      f.fail("model_role", "is \"" + role + "\", expected policy or critic");
    r.role = role;
  }
  return r;
}

optim_step_request decode_optim_step(std::string_view body) {
  const json j = parse_object(body, "optim_step");
  fields f(j, "optim_step");
  f.check_type({"optim_step"});
  optim_step_request r;
  r.model_id = f.str("model_id", true, true);
  r.seq_id = f.integer("seq_id", true);
  check_seq_id(f, r.seq_id);
  auto a = f.object("adam_params", true);
  auto& p = r.adam;
  auto read = [&](const char* key, double fallback, bool ok(double), const char* domain) {
    const double v = a.number(key, false, fallback);
    if (!std::isfinite(v) || !ok(v))
      a.fail(key, std::string("must be ") + domain + ", got " + number_text(v));
    return v;
  };
  p.learning_rate = read(
      "learning_rate", p.learning_rate, [](double v) { return v >= 0; }, "a finite number >= 0");
  p.beta1 = read(
      "beta1", p.beta1, [](double v) { return v >= 0 && v < 1; }, "in [0, 1)");
  p.beta2 = read(
      "beta2", p.beta2, [](double v) { return v >= 0 && v < 1; }, "in [0, 1)");
  p.eps = read(
      "eps", p.eps, [](double v) { return v > 0; }, "a finite number > 0");
  p.weight_decay = read(
      "weight_decay", p.weight_decay, [](double v) { return v >= 0; }, "a finite number >= 0");
  p.grad_clip_norm = read(
      "grad_clip_norm", p.grad_clip_norm, [](double v) { return v >= 0; },
      "a finite number >= 0 (0 = no clipping)");
  return r;
}

namespace {

void read_ttl(const fields& f, bool& has, int64_t& ttl) {
  ttl = f.integer("ttl_seconds", false, 0, &has);
  if (has && ttl < 1)
    f.fail("ttl_seconds", "must be >= 1, got " + std::to_string(ttl));
}

std::string checkpoint_name(const fields& f) {
  auto path = f.str("path", false);
  if (!path.empty() && !valid_checkpoint_name(path))
    f.fail("path", "\"" + path +
                       "\" is not a checkpoint name: use 1-128 of A-Z a-z 0-9 . _ - and do not "
                       "start with '.'");
  return path;
}

} // namespace

save_weights_request decode_save_weights(std::string_view body) {
  const json j = parse_object(body, "save_weights");
  fields f(j, "save_weights");
  f.check_type({"save_weights"});
  save_weights_request r;
  r.model_id = f.str("model_id", true, true);
  r.seq_id = f.integer("seq_id", true);
  check_seq_id(f, r.seq_id);
  r.path = checkpoint_name(f);
  read_ttl(f, r.has_ttl, r.ttl_seconds);
  r.overwrite = f.boolean("overwrite", false);
  return r;
}

save_weights_for_sampler_request decode_save_weights_for_sampler(std::string_view body) {
  const json j = parse_object(body, "save_weights_for_sampler");
  fields f(j, "save_weights_for_sampler");
  f.check_type({"save_weights_for_sampler"});
  save_weights_for_sampler_request r;
  r.model_id = f.str("model_id", true, true);
  r.seq_id = f.integer("seq_id", true);
  check_seq_id(f, r.seq_id);
  r.path = checkpoint_name(f);
  r.sampling_session_seq_id =
      f.integer("sampling_session_seq_id", false, 0, &r.has_sampling_session_seq_id, 0);
  read_ttl(f, r.has_ttl, r.ttl_seconds);
  return r;
}

load_weights_request decode_load_weights(std::string_view body) {
  const json j = parse_object(body, "load_weights");
  fields f(j, "load_weights");
  f.check_type({"load_weights"});
  load_weights_request r;
  const bool legacy = f.get("model_id") || f.get("seq_id");
  const bool create = f.get("session_id") || f.get("model_seq_id");
  if (legacy && create)
    user_error("load_weights: give either model_id + seq_id or session_id + model_seq_id, not "
               "both");
  if (!legacy && !create)
    user_error("load_weights: 'model_id' + 'seq_id' (or 'session_id' + 'model_seq_id') are "
               "required");
  r.create_via_load = create;
  if (legacy) {
    r.model_id = f.str("model_id", true, true);
    r.seq_id = f.integer("seq_id", true);
    check_seq_id(f, r.seq_id);
  } else {
    r.session_id = f.str("session_id", true, true);
    r.model_seq_id = f.integer("model_seq_id", true, 0, nullptr, 0);
    r.base_model = f.str("base_model", false);
    r.user_metadata = f.metadata("user_metadata");
  }
  r.path = f.str("path", true, true);
  if (!tinker_path(r.path))
    f.fail("path", "must start with tinker://, got \"" + r.path + "\"");
  r.optimizer = f.boolean("optimizer", true);
  r.weights_access_token = f.str("weights_access_token", false);
  return r;
}

create_sampling_session_request decode_create_sampling_session(std::string_view body) {
  const json j = parse_object(body, "create_sampling_session");
  fields f(j, "create_sampling_session");
  f.check_type({"create_sampling_session"});
  create_sampling_session_request r;
  r.session_id = f.str("session_id", true, true);
  r.sampling_session_seq_id = f.integer("sampling_session_seq_id", true, 0, nullptr, 0);
  r.model_path = f.str("model_path", false);
  r.base_model = f.str("base_model", false);
  if (!r.model_path.empty() && !tinker_path(r.model_path))
    f.fail("model_path", "must start with tinker://, got \"" + r.model_path + "\"");
  if (r.model_path.empty() && r.base_model.empty())
    user_error("create_sampling_session: one of 'model_path' or 'base_model' is required");
  return r;
}

retrieve_future_request decode_retrieve_future(std::string_view body) {
  const json j = parse_object(body, "retrieve_future");
  fields f(j, "retrieve_future");
  retrieve_future_request r;
  r.request_id = f.str("request_id", true, true);
  r.allow_metadata_only = f.boolean("allow_metadata_only", false);
  return r;
}

weights_info_request decode_weights_info(std::string_view body) {
  const json j = parse_object(body, "weights_info");
  fields f(j, "weights_info");
  weights_info_request r;
  r.tinker_path = f.str("tinker_path", true, true);
  if (!tinker_path(r.tinker_path))
    f.fail("tinker_path", "must start with tinker://, got \"" + r.tinker_path + "\"");
  return r;
}

model_id_request decode_get_info(std::string_view body) {
  const json j = parse_object(body, "get_info");
  fields f(j, "get_info");
  f.check_type({"get_info"});
  return {f.str("model_id", true, true)};
}

model_id_request decode_unload_model(std::string_view body) {
  const json j = parse_object(body, "unload_model");
  fields f(j, "unload_model");
  f.check_type({"unload_model"});
  return {f.str("model_id", true, true)};
}

} // namespace rlforge::service
