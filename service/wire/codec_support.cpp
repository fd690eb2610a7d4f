#include "service/wire/codec_support.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace rlforge::service::wire_detail {

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

namespace {

/// The first number of `body` JSON cannot hold (NaN, Infinity, -Infinity, as Python's json
/// writes them, or a literal beyond the double range) as "'path' is TOKEN"; "" when none is
/// found. A light scan (strings, nesting, keys), run only after the parser refused the body, so
/// the error can name the field.
std::string non_finite_number(std::string_view body) {
  struct frame {
    bool object;
    std::string key;
    size_t index = 0;
  };
  std::vector<frame> stack;
  bool expect_key = false;
  auto path = [&] {
    std::string out;
    for (const auto& f : stack)
      out += f.object ? (out.empty() ? "" : ".") + f.key : "[" + std::to_string(f.index) + "]";
    return out;
  };
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (c == '"') {
      std::string text;
      for (++i; i < body.size() && body[i] != '"'; ++i) {
        if (body[i] == '\\' && i + 1 < body.size())
          ++i;
        text += body[i];
      }
      ++i;
      if (expect_key && !stack.empty() && stack.back().object)
        stack.back().key = text;
      expect_key = false;
    } else if (c == '{' || c == '[') {
      stack.push_back({c == '{', "", 0});
      expect_key = c == '{';
      ++i;
    } else if (c == '}' || c == ']') {
      if (!stack.empty())
        stack.pop_back();
      ++i;
    } else if (c == ',') {
      if (!stack.empty() && !stack.back().object)
        ++stack.back().index;
      expect_key = !stack.empty() && stack.back().object;
      ++i;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') {
      size_t end = i;
      while (end < body.size() && (std::isalnum(static_cast<unsigned char>(body[end])) ||
                                   body[end] == '-' || body[end] == '+' || body[end] == '.'))
        ++end;
      const std::string token{body.substr(i, end - i)};
      i = end;
      const bool named = token == "NaN" || token == "Infinity" || token == "-Infinity" ||
                         token == "+Infinity";
      const bool numeric = std::isdigit(static_cast<unsigned char>(token.back())) != 0;
      if (named || (numeric && !std::isfinite(std::strtod(token.c_str(), nullptr))))
        return "'" + path() + "' is " + token;
    } else {
      ++i;
    }
  }
  return "";
}

} // namespace

json parse_object(std::string_view body, const std::string& endpoint) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    if (auto field = non_finite_number(body); !field.empty())
      user_error(endpoint + ": " + field + "; numbers must be finite JSON numbers");
    user_error(endpoint + ": malformed JSON body: " + e.what());
  }
  if (!j.is_object())
    user_error(endpoint + ": body must be a JSON object, got " + j.type_name());
  return j;
}

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

/// The SDK's public JSON dtypes: floats collapse to float32, integers to int64.
const char* public_dtype(dtype t) {
  return tinker::is_floating(t) ? "float32" : "int64";
}

json float_json(double v) {
  return std::isfinite(v) ? json(static_cast<double>(static_cast<float>(v))) : json(nullptr);
}

} // namespace rlforge::service::wire_detail
