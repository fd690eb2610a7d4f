#include "text/hf/json_reader.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/error.hpp"

namespace rlforge::text::hf {

std::string path(const std::string& where, std::string_view key) {
  return where + "." + std::string(key);
}

std::string path(const std::string& where, size_t index) {
  return where + "[" + std::to_string(index) + "]";
}

std::string describe(const json& j) {
  switch (j.type()) {
  case json::value_t::null:
    return "null";
  case json::value_t::object:
    return "an object";
  case json::value_t::array:
    return "an array";
  case json::value_t::string:
    return "a string";
  case json::value_t::boolean:
    return "a boolean";
  case json::value_t::number_integer:
  case json::value_t::number_unsigned:
  case json::value_t::number_float:
    return "a number";
  default:
    return "an unsupported JSON value";
  }
}

void require_object(const json& j, const std::string& where) {
  if (!j.is_object())
    fail(where + ": expected an object, got " + describe(j));
}

void require_known_fields(const json& j, std::initializer_list<std::string_view> known,
                          const std::string& where) {
  require_object(j, where);
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (auto k : known)
      ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (auto k : known)
        list += (list.empty() ? "" : ", ") + std::string(k);
      fail(path(where, it.key()) + ": unknown field (this library reads only: " + list + ")");
    }
  }
}

const json* find(const json& j, std::string_view key) {
  auto it = j.find(std::string(key));
  return it == j.end() ? nullptr : &*it;
}

const json& require(const json& j, std::string_view key, const std::string& where) {
  require_object(j, where);
  const json* v = find(j, key);
  if (v == nullptr)
    fail(path(where, key) + ": missing");
  return *v;
}

std::string as_string(const json& j, const std::string& where) {
  if (!j.is_string())
    fail(where + ": expected a string, got " + describe(j));
  return j.get<std::string>();
}

std::string get_string(const json& j, std::string_view key, const std::string& where) {
  return as_string(require(j, key, where), path(where, key));
}

std::optional<std::string> get_optional_string(const json& j, std::string_view key,
                                               const std::string& where) {
  const json* v = find(j, key);
  if (v == nullptr || v->is_null())
    return std::nullopt;
  return as_string(*v, path(where, key));
}

bool get_bool(const json& j, std::string_view key, bool fallback, const std::string& where) {
  const json* v = find(j, key);
  if (v == nullptr || v->is_null())
    return fallback;
  if (!v->is_boolean())
    fail(path(where, key) + ": expected a boolean, got " + describe(*v));
  return v->get<bool>();
}

bool require_bool(const json& j, std::string_view key, const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_boolean())
    fail(path(where, key) + ": expected a boolean, got " + describe(v));
  return v.get<bool>();
}

int64_t get_int(const json& j, std::string_view key, int64_t lo, int64_t hi,
                const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_number_integer())
    fail(path(where, key) + ": expected an integer, got " + describe(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    fail(path(where, key) + ": " + v.dump() + " is out of range [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "]");
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    fail(path(where, key) + ": " + std::to_string(x) + " is out of range [" + std::to_string(lo) +
         ", " + std::to_string(hi) + "]");
  return x;
}

std::string type_of(const json& j, const std::string& where) {
  return get_string(j, "type", where);
}

json parse_json(std::string_view text, const std::string& source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(source + ": malformed JSON: " + e.what());
  }
}

json read_json_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    fail(file + ": cannot be opened for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    fail(file + ": read error");
  return parse_json(buffer.str(), file);
}

} // namespace rlforge::text::hf
