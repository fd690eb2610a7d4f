#include "chat/evaluator.hpp"

#include <unordered_map>

#include "chat/arguments.hpp"
#include "chat/filters.hpp"
#include "chat/globals.hpp"
#include "chat/methods.hpp"
#include "chat/operators.hpp"
#include "chat/predicates.hpp"

namespace rlforge::chat::detail {

namespace {

using k = value::kind;

/// One level of variables. Shared so that a macro keeps the scope it was defined in.
struct scope {
  std::unordered_map<std::string, value> vars;
  std::shared_ptr<scope> parent;
};
using scope_ptr = std::shared_ptr<scope>;

enum class flow { normal, loop_break, loop_continue };

/// Output and loop-control depth limits keep a runaway template from exhausting memory or stack.
constexpr std::size_t max_output_bytes = std::size_t{1} << 28;
constexpr int max_call_depth = 256;

class evaluator {
public:
  explicit evaluator(const value_dict& variables) : globals_(make_globals()) {
    root_ = std::make_shared<scope>();
    for (const auto& [key, v] : variables.items())
      root_->vars[key] = v;
  }

  evaluator(const evaluator&) = delete;
  evaluator& operator=(const evaluator&) = delete;

  /// A macro holds the scope it was defined in, and that scope holds the macro: clearing the
  /// scopes that define macros breaks the cycle.
  ~evaluator() {
    for (const auto& sc : macro_scopes_)
      sc->vars.clear();
  }

  std::string run(const stmt_list& program) {
    std::string out;
    exec_block(program, root_, out);
    return out;
  }

private:
  // ---- statements ----

  flow exec_block(const stmt_list& block, const scope_ptr& sc, std::string& out) {
    for (const auto& s : block) {
      const flow f = exec(*s, sc, out);
      if (f != flow::normal)
        return f;
      if (out.size() > max_output_bytes)
        throw template_error(error_kind::runtime, "rendered text exceeds 256 MiB", s->where);
    }
    return flow::normal;
  }

  flow exec(const stmt& s, const scope_ptr& sc, std::string& out) {
    switch (s.kind) {
    case stmt_kind::text:
      out += s.text;
      return flow::normal;
    case stmt_kind::output:
      out += to_str(eval(*s.value, sc), s.value->where);
      return flow::normal;
    case stmt_kind::if_chain:
      for (const auto& [test, body] : s.branches)
        if (truthy(eval(*test, sc)))
          return exec_block(body, sc, out);
      return exec_block(s.else_body, sc, out);
    case stmt_kind::for_loop:
      exec_for(s, sc, out);
      return flow::normal;
    case stmt_kind::set:
      assign(s.assign, eval(*s.value, sc), sc, s.where);
      return flow::normal;
    case stmt_kind::set_block: {
      std::string captured;
      exec_block(s.body, sc, captured);
      assign(s.assign, value::string(std::move(captured)), sc, s.where);
      return flow::normal;
    }
    case stmt_kind::macro:
      sc->vars[s.name] = make_macro(s, sc);
      macro_scopes_.push_back(sc);
      return flow::normal;
    case stmt_kind::loop_break:
      return flow::loop_break;
    case stmt_kind::loop_continue:
      return flow::loop_continue;
    case stmt_kind::generation:
      return exec_block(s.body, sc, out);
    }
    return flow::normal;
  }

  void bind_target(const target& t, const value& v, scope& sc, source_position where) {
    if (!t.tuple) {
      sc.vars[t.names[0]] = v;
      return;
    }
    const std::vector<value> items = iterate(v, where);
    if (items.size() != t.names.size())
      throw template_error(error_kind::runtime,
                           "cannot unpack " + std::to_string(items.size()) + " value(s) into " +
                               std::to_string(t.names.size()) + " name(s)",
                           where);
    for (std::size_t i = 0; i < items.size(); ++i)
      sc.vars[t.names[i]] = items[i];
  }

  void assign(const target& t, const value& v, const scope_ptr& sc, source_position where) {
    if (t.attribute.empty()) {
      bind_target(t, v, *sc, where);
      return;
    }
    const value ns = lookup(t.names[0], sc, where);
    if (!ns.is(k::object) || !ns.as_object().assignable)
      throw template_error(error_kind::runtime,
                           "cannot assign attribute '" + t.attribute + "' on '" + t.names[0] +
                               "', a " + type_name(ns) + " (only a namespace() takes attributes)",
                           where);
    ns.as_object().attributes.set(t.attribute, v);
  }

  void exec_for(const stmt& s, const scope_ptr& outer, std::string& out) {
    const value iterable = eval(*s.value, outer);
    std::vector<value> items = iterate(iterable, s.value->where);
    auto sc = std::make_shared<scope>();
    sc->parent = outer;
    if (s.condition) {
      std::vector<value> kept;
      for (auto& item : items) {
        bind_target(s.assign, item, *sc, s.where);
        if (truthy(eval(*s.condition, sc)))
          kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto loop = std::make_shared<object_data>();
      loop->type_name = "LoopContext";
      auto& a = loop->attributes;
      a.set("index", value::integer(i + 1));
      a.set("index0", value::integer(i));
      a.set("revindex", value::integer(n - i));
      a.set("revindex0", value::integer(n - i - 1));
      a.set("first", value::boolean(i == 0));
      a.set("last", value::boolean(i == n - 1));
      a.set("length", value::integer(n));
      a.set("depth", value::integer(1));
      a.set("depth0", value::integer(0));
      a.set("previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)]
                              : value::undefined("there is no previous item"));
      a.set("nextitem", i + 1 < n ? items[static_cast<std::size_t>(i + 1)]
                                  : value::undefined("there is no next item"));
      sc->vars["loop"] = value::object(std::move(loop));
      bind_target(s.assign, items[static_cast<std::size_t>(i)], *sc, s.where);
      if (exec_block(s.body, sc, out) == flow::loop_break)
        break;
    }
    if (n == 0)
      exec_block(s.else_body, sc, out);
  }

  value make_macro(const stmt& s, const scope_ptr& defined_in) {
    const stmt* m = &s;
    return value::function(s.name, [this, m, defined_in](call_args& args) {
      if (args.positional.size() > m->params.size())
        throw template_error(error_kind::runtime,
                             "macro '" + m->name + "' takes not more than " +
                                 std::to_string(m->params.size()) + " argument(s)",
                             args.where);
      auto sc = std::make_shared<scope>();
      sc->parent = defined_in;
      std::vector<bool> bound(m->params.size(), false);
      for (std::size_t i = 0; i < args.positional.size(); ++i) {
        sc->vars[m->params[i].name] = args.positional[i];
        bound[i] = true;
      }
      for (const auto& [key, v] : args.keyword) {
        std::size_t i = 0;
        while (i < m->params.size() && m->params[i].name != key)
          ++i;
        if (i == m->params.size())
          throw template_error(error_kind::runtime,
                               "macro '" + m->name + "' takes no keyword argument '" + key + "'",
                               args.where);
        if (bound[i])
          throw template_error(error_kind::runtime,
                               "macro '" + m->name + "' got multiple values for '" + key + "'",
                               args.where);
        sc->vars[key] = v;
        bound[i] = true;
      }
      for (std::size_t i = 0; i < m->params.size(); ++i) {
        if (bound[i])
          continue;
        const auto& p = m->params[i];
        sc->vars[p.name] = p.default_value
                               ? eval(*p.default_value, sc)
                               : value::undefined("parameter '" + p.name + "' was not provided");
      }
      if (++depth_ > max_call_depth)
        throw template_error(error_kind::runtime, "macro calls nested too deeply", args.where);
      std::string out;
      try {
        exec_block(m->body, sc, out);
      } catch (...) {
        --depth_;
        throw;
      }
      --depth_;
      return value::string(std::move(out));
    });
  }

  // ---- expressions ----

  value lookup(const std::string& name, const scope_ptr& sc, source_position where) const {
    for (const scope* s = sc.get(); s != nullptr; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end())
        return it->second;
    }
    if (const value* g = globals_.find(name))
      return *g;
    if (name == "varargs" || name == "kwargs" || name == "caller")
      throw template_error(error_kind::unsupported,
                           "the macro variable '" + name + "' is not supported", where);
    return value::undefined("'" + name + "' is undefined");
  }

  call_args eval_args(const expr& e, const scope_ptr& sc) {
    call_args a;
    a.where = e.where;
    for (std::size_t i = 1; i < e.args.size(); ++i)
      a.positional.push_back(eval(*e.args[i], sc));
    for (const auto& [key, v] : e.kwargs)
      a.keyword.emplace_back(key, eval(*v, sc));
    return a;
  }

  value eval(const expr& e, const scope_ptr& sc) {
    switch (e.kind) {
    case expr_kind::literal:
      return e.constant;
    case expr_kind::name:
      return lookup(e.name, sc, e.where);
    case expr_kind::list:
    case expr_kind::tuple: {
      value_list items;
      for (const auto& a : e.args)
        items.push_back(eval(*a, sc));
      return value::list(std::move(items));
    }
    case expr_kind::dict: {
      value_dict d;
      for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
        const value key = eval(*e.args[i], sc);
        if (!key.is(k::string))
          throw template_error(error_kind::unsupported,
                               "dict keys other than strings are not supported (got " +
                                   type_name(key) + ")",
                               e.args[i]->where);
        d.set(key.as_string(), eval(*e.args[i + 1], sc));
      }
      return value::dict(std::move(d));
    }
    case expr_kind::getattr:
      return get_attribute(eval(*e.args[0], sc), e.name, e.where);
    case expr_kind::getitem:
      return get_item(eval(*e.args[0], sc), eval(*e.args[1], sc), e.where);
    case expr_kind::slice: {
      const value obj = eval(*e.args[0], sc);
      std::optional<value> parts[3];
      for (int i = 0; i < 3; ++i)
        if (e.args[static_cast<std::size_t>(i) + 1])
          parts[i] = eval(*e.args[static_cast<std::size_t>(i) + 1], sc);
      return get_slice(obj, parts[0], parts[1], parts[2], e.where);
    }
    case expr_kind::call: {
      const value callee = eval(*e.args[0], sc);
      if (callee.is_undefined())
        fail_undefined(callee, e.where);
      if (!callee.is(k::function))
        throw template_error(error_kind::runtime,
                             "'" + type_name(callee) + "' object is not callable", e.where);
      call_args a = eval_args(e, sc);
      return callee.as_function().body(a);
    }
    case expr_kind::filter: {
      const value subject = eval(*e.args[0], sc);
      call_args a = eval_args(e, sc);
      return apply_filter(e.name, subject, a);
    }
    case expr_kind::test: {
      const value subject = eval(*e.args[0], sc);
      call_args a = eval_args(e, sc);
      const bool r = apply_test(e.name, subject, a);
      return value::boolean(e.negated ? !r : r);
    }
    case expr_kind::logic_not:
      return value::boolean(!truthy(eval(*e.args[0], sc)));
    case expr_kind::negate:
      return unary_op('-', eval(*e.args[0], sc), e.where);
    case expr_kind::plus:
      return unary_op('+', eval(*e.args[0], sc), e.where);
    case expr_kind::binary:
      return binary_op(e.name, eval(*e.args[0], sc), eval(*e.args[1], sc), e.where);
    case expr_kind::compare:
      return value::boolean(eval_compare(e, sc));
    case expr_kind::logic_and: {
      value left = eval(*e.args[0], sc);
      return truthy(left) ? eval(*e.args[1], sc) : left;
    }
    case expr_kind::logic_or: {
      value left = eval(*e.args[0], sc);
      return truthy(left) ? left : eval(*e.args[1], sc);
    }
    case expr_kind::condition:
      if (truthy(eval(*e.args[1], sc)))
        return eval(*e.args[0], sc);
      if (e.args[2])
        return eval(*e.args[2], sc);
      return value::undefined("the condition of an inline if without else was false");
    }
    return value();
  }

  bool eval_compare(const expr& e, const scope_ptr& sc) {
    value left = eval(*e.args[0], sc);
    for (std::size_t i = 0; i < e.ops.size(); ++i) {
      value right = eval(*e.args[i + 1], sc);
      const std::string& op = e.ops[i];
      bool r;
      if (op == "==") {
        r = equals(left, right);
      } else if (op == "!=") {
        r = !equals(left, right);
      } else if (op == "in") {
        r = contains(right, left, e.where);
      } else if (op == "not in") {
        r = !contains(right, left, e.where);
      } else {
        if (left.is_undefined())
          fail_undefined(left, e.where);
        if (right.is_undefined())
          fail_undefined(right, e.where);
        const int c = compare(left, right, e.where);
        if (c == 2)
          r = false;
        else if (op == "<")
          r = c < 0;
        else if (op == "<=")
          r = c <= 0;
        else if (op == ">")
          r = c > 0;
        else
          r = c >= 0;
      }
      if (!r)
        return false;
      left = std::move(right);
    }
    return true;
  }

  value_dict globals_;
  scope_ptr root_;
  std::vector<scope_ptr> macro_scopes_;
  int depth_ = 0;
};

} // namespace

std::string render(const stmt_list& program, const value_dict& variables) {
  return evaluator(variables).run(program);
}

} // namespace rlforge::chat::detail
