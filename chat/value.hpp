#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/error.hpp"

/// The values a template computes with, modelled on the Python objects Jinja sees when
/// transformers renders a chat template: None, bool, int, float, str (a sequence of code points,
/// held as UTF-8), list, dict (insertion-ordered, string keys), Jinja's Undefined, a namespace or
/// loop object, and callables. Lists and dicts are shared and immutable once built (templates
/// cannot mutate them); a namespace is shared and mutable, as in Jinja.
///
/// Thread safety: a value may be read from several threads; a namespace is mutated only by the
/// render that created it.
namespace rlforge::chat::detail {

class value;
class value_dict;
struct object_data;
struct function_data;
struct call_args;

using value_list = std::vector<value>;

/// Jinja's Undefined: what a missing variable, key, attribute or index evaluates to. `hint` says
/// what was missing, for the error raised when it is used in a way Undefined forbids.
struct undefined_value {
  std::string hint;
};

class value {
public:
  /// The Python type; the order matches the variant below.
  enum class kind {
    undefined,
    none,
    boolean,
    integer,
    floating,
    string,
    list,
    dict,
    object,
    function
  };

  value() = default; ///< Undefined without a hint.

  static value undefined(std::string hint);
  static value none();
  static value boolean(bool x);
  static value integer(int64_t x);
  static value floating(double x);
  static value string(std::string x);
  static value list(value_list x);
  static value dict(value_dict x);
  static value object(std::shared_ptr<object_data> x);
  static value function(std::string name, std::function<value(call_args&)> body);

  kind type() const noexcept { return static_cast<kind>(data_.index()); }
  bool is(kind k) const noexcept { return type() == k; }
  bool is_undefined() const noexcept { return type() == kind::undefined; }

  // Accessors; each requires the matching kind.
  const std::string& undefined_hint() const { return std::get<undefined_value>(data_).hint; }
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const value_list& as_list() const { return *std::get<std::shared_ptr<const value_list>>(data_); }
  const value_dict& as_dict() const { return *std::get<std::shared_ptr<const value_dict>>(data_); }
  object_data& as_object() const { return *std::get<std::shared_ptr<object_data>>(data_); }
  const function_data& as_function() const {
    return *std::get<std::shared_ptr<const function_data>>(data_);
  }
  /// Identity of a shared object (namespace, function), for Python's `==` on them.
  const void* identity() const noexcept;

private:
  std::variant<undefined_value, std::nullptr_t, bool, int64_t, double, std::string,
               std::shared_ptr<const value_list>, std::shared_ptr<const value_dict>,
               std::shared_ptr<object_data>, std::shared_ptr<const function_data>>
      data_;
};

/// A dict with string keys in insertion order (Python 3.7+ semantics); `set` on an existing key
/// replaces its value in place.
class value_dict {
public:
  const value* find(std::string_view key) const;
  void set(const std::string& key, value v);
  const std::vector<std::pair<std::string, value>>& items() const noexcept { return items_; }
  std::size_t size() const noexcept { return items_.size(); }

private:
  std::vector<std::pair<std::string, value>> items_;
  std::unordered_map<std::string, std::size_t> index_;
};

/// An attribute container that is not a mapping: `namespace(...)` (mutable through
/// `{% set ns.x = ... %}`) or a for loop's `loop`.
struct object_data {
  std::string type_name; ///< "namespace" or "LoopContext"
  bool assignable = false;
  value_dict attributes;
};

/// Arguments of a call: positional, then keyword (in source order), and where the call is.
struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;
  source_position where;
};

/// A callable: a global function, a bound method or a macro.
struct function_data {
  std::string name;
  std::function<value(call_args&)> body;
};

/// Python's type name of `x` ("str", "dict", "NoneType", "Undefined", ...).
std::string type_name(const value& x);

/// Python truthiness (Undefined is false).
bool truthy(const value& x);

/// Python `str(x)` as Jinja prints it: Undefined is "", None "None", booleans "True"/"False",
/// floats by `repr`. Lists, dicts, namespaces and callables have Python reprs this engine does
/// not reproduce: they are refused (error_kind::unsupported) naming the type and `where`.
std::string to_str(const value& x, source_position where);

/// Python `a == b` (1 == 1.0 == True; lists and dicts compare by content; Undefined equals only
/// Undefined).
bool equals(const value& a, const value& b);

/// Python ordering of `a` and `b` (-1, 0, 1) for numbers, strings (by code point) and lists;
/// other pairs throw error_kind::runtime naming both types.
int compare(const value& a, const value& b, source_position where);

/// The value a JSON document maps to (as Python's json.loads would give it); object keys keep
/// their order.
value from_json(const nlohmann::ordered_json& x);

} // namespace rlforge::chat::detail
