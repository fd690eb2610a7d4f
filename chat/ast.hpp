#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/error.hpp"
#include "chat/value.hpp"

/// The syntax tree the parser builds and the evaluator walks. Plain data, immutable after
/// parsing; shared read-only by concurrent renders.
namespace rlforge::chat::detail {

struct expr;
struct stmt;
using expr_ptr = std::unique_ptr<expr>;
using stmt_ptr = std::unique_ptr<stmt>;
using stmt_list = std::vector<stmt_ptr>;

enum class expr_kind {
  literal,   ///< `constant`
  name,      ///< variable `name`
  list,      ///< [args...]
  tuple,     ///< (args...) — a list at run time
  dict,      ///< {args[2i]: args[2i+1]}
  getattr,   ///< args[0].name
  getitem,   ///< args[0][args[1]]
  slice,     ///< args[0][args[1]:args[2]:args[3]] (null = omitted)
  call,      ///< args[0](args[1..], kwargs)
  filter,    ///< args[0] | name(args[1..], kwargs)
  test,      ///< args[0] is [not] name(args[1..], kwargs)
  logic_not, ///< not args[0]
  negate,    ///< -args[0]
  plus,      ///< +args[0]
  binary,    ///< args[0] <name> args[1]: + - * / // % ** ~
  compare,   ///< args[0] ops[0] args[1] ops[1] args[2] ... (== != < <= > >= in, not in)
  logic_and, ///< args[0] and args[1]
  logic_or,  ///< args[0] or args[1]
  condition, ///< args[0] if args[1] else args[2] (args[2] null: no else)
};

struct expr {
  expr_kind kind = expr_kind::literal;
  source_position where;
  value constant;
  std::string name;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

enum class stmt_kind {
  text,      ///< `text`
  output,    ///< {{ value }}
  if_chain,  ///< branches (test, body)...; else_body
  for_loop,  ///< for targets in value [if condition]: body; else_body
  set,       ///< set targets = value, or set namespace.attribute = value
  set_block, ///< set targets %}body{% endset
  macro,     ///< macro name(params)
  loop_break,
  loop_continue,
  generation, ///< transformers' {% generation %}: renders its body
};

/// Where a set or for assigns: one or more names, or an attribute of a namespace.
struct target {
  std::vector<std::string> names; ///< one name, or the names of a tuple
  bool tuple = false;
  std::string attribute; ///< set: names[0].attribute = ...
};

struct macro_param {
  std::string name;
  expr_ptr default_value; ///< null: required
};

struct stmt {
  stmt_kind kind = stmt_kind::text;
  source_position where;
  std::string text;
  expr_ptr value;
  expr_ptr condition;
  target assign;
  std::vector<std::pair<expr_ptr, stmt_list>> branches;
  stmt_list body;
  stmt_list else_body;
  std::string name;
  std::vector<macro_param> params;
};

} // namespace rlforge::chat::detail
