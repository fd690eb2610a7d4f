#include "chat/parser.hpp"

#include "chat/filters.hpp"
#include "chat/predicates.hpp"

#include <algorithm>
#include <initializer_list>

namespace rlforge::chat::detail {

namespace {

const char* describe(token_kind k) {
  switch (k) {
  case token_kind::text:
    return "text";
  case token_kind::variable_begin:
    return "'{{'";
  case token_kind::variable_end:
    return "'}}'";
  case token_kind::block_begin:
    return "'{%'";
  case token_kind::block_end:
    return "'%}'";
  case token_kind::name:
    return "name";
  case token_kind::string:
    return "string";
  case token_kind::integer:
    return "integer";
  case token_kind::floating:
    return "float";
  case token_kind::op:
    return "operator";
  case token_kind::end:
    return "end of template";
  }
  return "token";
}

std::string show(const token& t) {
  switch (t.kind) {
  case token_kind::name:
  case token_kind::op:
    return "'" + t.text + "'";
  case token_kind::string:
    return "string literal";
  default:
    return describe(t.kind);
  }
}

class parser {
public:
  explicit parser(const std::vector<token>& tokens) : tokens_(tokens) {}

  stmt_list run() {
    stmt_list out = parse_body({});
    if (cur().kind != token_kind::end)
      fail("unexpected " + show(cur()));
    return out;
  }

private:
  const token& cur() const { return tokens_[pos_]; }
  const token& peek(std::size_t n = 1) const {
    return tokens_[std::min(pos_ + n, tokens_.size() - 1)];
  }
  const token& next() {
    const token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size())
      ++pos_;
    return t;
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw template_error(error_kind::syntax, message, cur().where);
  }

  bool is_op(const char* op) const { return cur().kind == token_kind::op && cur().text == op; }
  bool is_name(const char* name) const {
    return cur().kind == token_kind::name && cur().text == name;
  }

  void expect_op(const char* op) {
    if (!is_op(op))
      fail(std::string("expected '") + op + "', got " + show(cur()));
    next();
  }
  std::string expect_name(const char* what) {
    if (cur().kind != token_kind::name)
      fail(std::string("expected ") + what + ", got " + show(cur()));
    return next().text;
  }
  void expect_block_end(const char* tag) {
    if (cur().kind != token_kind::block_end)
      fail(std::string("expected '%}' to close '") + tag + "', got " + show(cur()));
    next();
  }

  // ---- statements ----

  /// Statements up to a `{% name` with name in `ends` (left at that name) or the end.
  stmt_list parse_body(std::initializer_list<const char*> ends) {
    stmt_list out;
    while (true) {
      const token& t = cur();
      switch (t.kind) {
      case token_kind::end:
        if (ends.size() != 0)
          fail(std::string("unexpected end of template: expected '{% ") + *(ends.end() - 1) +
               " %}'");
        return out;
      case token_kind::text: {
        auto s = std::make_unique<stmt>();
        s->kind = stmt_kind::text;
        s->text = t.text;
        s->where = t.where;
        out.push_back(std::move(s));
        next();
        break;
      }
      case token_kind::variable_begin: {
        auto s = std::make_unique<stmt>();
        s->kind = stmt_kind::output;
        s->where = t.where;
        next();
        s->value = parse_tuple(true);
        if (cur().kind != token_kind::variable_end)
          fail("expected '}}', got " + show(cur()));
        next();
        out.push_back(std::move(s));
        break;
      }
      case token_kind::block_begin: {
        const token& name = peek();
        if (name.kind == token_kind::name &&
            std::any_of(ends.begin(), ends.end(), [&](const char* e) { return name.text == e; })) {
          next();
          return out;
        }
        next();
        out.push_back(parse_statement());
        break;
      }
      default:
        fail("unexpected " + show(t));
      }
    }
  }

  stmt_ptr parse_statement() {
    const token& t = cur();
    if (t.kind != token_kind::name)
      fail("expected a tag name after '{%', got " + show(t));
    const std::string& tag = t.text;
    if (tag == "if")
      return parse_if();
    if (tag == "for")
      return parse_for();
    if (tag == "set")
      return parse_set();
    if (tag == "macro")
      return parse_macro();
    if (tag == "generation") {
      auto s = std::make_unique<stmt>();
      s->kind = stmt_kind::generation;
      s->where = t.where;
      next();
      expect_block_end("generation");
      s->body = parse_body({"endgeneration"});
      next();
      expect_block_end("endgeneration");
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0)
        fail("'" + tag + "' outside a for loop");
      auto s = std::make_unique<stmt>();
      s->kind = tag == "break" ? stmt_kind::loop_break : stmt_kind::loop_continue;
      s->where = t.where;
      next();
      expect_block_end(tag == "break" ? "break" : "continue");
      return s;
    }
    static const char* const closers[] = {"elif",   "else",     "endif",        "endfor",
                                          "endset", "endmacro", "endgeneration"};
    for (const char* c : closers)
      if (tag == c)
        fail("unexpected '{% " + tag + " %}' with no open block it could close");
    throw template_error(error_kind::unsupported, "tag '" + tag + "' is not supported", t.where);
  }

  stmt_ptr parse_if() {
    auto s = std::make_unique<stmt>();
    s->kind = stmt_kind::if_chain;
    s->where = cur().where;
    next(); // if
    while (true) {
      expr_ptr test = parse_tuple(true);
      expect_block_end("if");
      stmt_list body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(test), std::move(body));
      const std::string tag = next().text;
      if (tag == "elif")
        continue;
      if (tag == "else") {
        expect_block_end("else");
        s->else_body = parse_body({"endif"});
        next();
      }
      expect_block_end("endif");
      return s;
    }
  }

  target parse_target(bool allow_attribute) {
    target out;
    const bool paren = is_op("(");
    if (paren)
      next();
    out.names.push_back(expect_name("a variable name"));
    if (allow_attribute && is_op(".")) {
      next();
      out.attribute = expect_name("an attribute name");
      return out;
    }
    while (is_op(",")) {
      out.tuple = true;
      next();
      if (cur().kind != token_kind::name)
        break;
      out.names.push_back(next().text);
    }
    if (paren)
      expect_op(")");
    return out;
  }

  stmt_ptr parse_for() {
    auto s = std::make_unique<stmt>();
    s->kind = stmt_kind::for_loop;
    s->where = cur().where;
    next(); // for
    s->assign = parse_target(false);
    if (!is_name("in"))
      fail("expected 'in' in a for loop, got " + show(cur()));
    next();
    s->value = parse_tuple(false);
    if (is_name("if")) {
      next();
      s->condition = parse_expression(true);
    }
    if (is_name("recursive"))
      throw template_error(error_kind::unsupported, "recursive for loops are not supported",
                           cur().where);
    expect_block_end("for");
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end("else");
      s->else_body = parse_body({"endfor"});
      next();
    }
    expect_block_end("endfor");
    return s;
  }

  stmt_ptr parse_set() {
    auto s = std::make_unique<stmt>();
    s->where = cur().where;
    next(); // set
    s->assign = parse_target(true);
    if (is_op("=")) {
      next();
      s->kind = stmt_kind::set;
      s->value = parse_tuple(true);
      expect_block_end("set");
      return s;
    }
    if (!s->assign.attribute.empty())
      fail("a block set cannot assign a namespace attribute");
    if (is_op("|"))
      throw template_error(error_kind::unsupported, "filtered block set is not supported",
                           cur().where);
    s->kind = stmt_kind::set_block;
    expect_block_end("set");
    s->body = parse_body({"endset"});
    next();
    expect_block_end("endset");
    return s;
  }

  stmt_ptr parse_macro() {
    auto s = std::make_unique<stmt>();
    s->kind = stmt_kind::macro;
    s->where = cur().where;
    next(); // macro
    s->name = expect_name("a macro name");
    expect_op("(");
    bool defaults = false;
    while (!is_op(")")) {
      macro_param p;
      p.name = expect_name("a parameter name");
      if (is_op("=")) {
        next();
        p.default_value = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail("parameter '" + p.name + "' without a default follows one with a default");
      }
      s->params.push_back(std::move(p));
      if (!is_op(","))
        break;
      next();
    }
    expect_op(")");
    expect_block_end("macro");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    next();
    if (cur().kind == token_kind::name && cur().text == s->name)
      next();
    expect_block_end("endmacro");
    return s;
  }

  // ---- expressions ----

  expr_ptr make(expr_kind kind, source_position where) {
    auto e = std::make_unique<expr>();
    e->kind = kind;
    e->where = where;
    return e;
  }

  expr_ptr parse_tuple(bool with_condexpr) {
    const source_position where = cur().where;
    expr_ptr first = parse_expression(with_condexpr);
    if (!is_op(","))
      return first;
    auto t = make(expr_kind::tuple, where);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (at_expression_end())
        break;
      t->args.push_back(parse_expression(with_condexpr));
    }
    return t;
  }

  bool at_expression_end() const {
    const token& t = cur();
    return t.kind == token_kind::variable_end || t.kind == token_kind::block_end ||
           t.kind == token_kind::end || (t.kind == token_kind::op && t.text == ")") ||
           (t.kind == token_kind::name && (t.text == "if" || t.text == "in"));
  }

  expr_ptr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  expr_ptr parse_condexpr() {
    expr_ptr e = parse_or();
    while (is_name("if")) {
      const source_position where = cur().where;
      next();
      auto c = make(expr_kind::condition, where);
      expr_ptr test = parse_or();
      expr_ptr otherwise;
      if (is_name("else")) {
        next();
        otherwise = parse_condexpr();
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  expr_ptr binary(expr_kind kind, const std::string& op, expr_ptr l, expr_ptr r,
                  source_position where) {
    auto e = make(kind, where);
    e->name = op;
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  expr_ptr parse_or() {
    expr_ptr e = parse_and();
    while (is_name("or")) {
      const auto where = next().where;
      e = binary(expr_kind::logic_or, "or", std::move(e), parse_and(), where);
    }
    return e;
  }

  expr_ptr parse_and() {
    expr_ptr e = parse_not();
    while (is_name("and")) {
      const auto where = next().where;
      e = binary(expr_kind::logic_and, "and", std::move(e), parse_not(), where);
    }
    return e;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      auto e = make(expr_kind::logic_not, next().where);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    const source_position where = cur().where;
    expr_ptr first = parse_math1();
    expr_ptr e;
    while (true) {
      std::string op;
      if (cur().kind == token_kind::op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == token_kind::name && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!e) {
        e = make(expr_kind::compare, where);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->args.push_back(parse_math1());
    }
    return e ? std::move(e) : std::move(first);
  }

  expr_ptr parse_math1() {
    expr_ptr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const token& t = next();
      e = binary(expr_kind::binary, t.text, std::move(e), parse_concat(), t.where);
    }
    return e;
  }

  expr_ptr parse_concat() {
    expr_ptr e = parse_math2();
    while (is_op("~")) {
      const token& t = next();
      e = binary(expr_kind::binary, "~", std::move(e), parse_math2(), t.where);
    }
    return e;
  }

  expr_ptr parse_math2() {
    expr_ptr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const token& t = next();
      e = binary(expr_kind::binary, t.text, std::move(e), parse_pow(), t.where);
    }
    return e;
  }

  expr_ptr parse_pow() {
    expr_ptr e = parse_unary(true);
    while (is_op("**")) {
      const token& t = next();
      e = binary(expr_kind::binary, "**", std::move(e), parse_unary(true), t.where);
    }
    return e;
  }

  expr_ptr parse_unary(bool with_filter) {
    expr_ptr e;
    if (is_op("-") || is_op("+")) {
      const token& t = next();
      e = make(t.text == "-" ? expr_kind::negate : expr_kind::plus, t.where);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter)
      e = parse_filter_expr(std::move(e));
    return e;
  }

  expr_ptr parse_primary() {
    const token& t = cur();
    switch (t.kind) {
    case token_kind::name: {
      next();
      auto e = make(expr_kind::literal, t.where);
      if (t.text == "true" || t.text == "True") {
        e->constant = value::boolean(true);
      } else if (t.text == "false" || t.text == "False") {
        e->constant = value::boolean(false);
      } else if (t.text == "none" || t.text == "None") {
        e->constant = value::none();
      } else {
        e->kind = expr_kind::name;
        e->name = t.text;
      }
      return e;
    }
    case token_kind::string: {
      auto e = make(expr_kind::literal, t.where);
      std::string s;
      while (cur().kind == token_kind::string)
        s += next().text;
      e->constant = value::string(std::move(s));
      return e;
    }
    case token_kind::integer: {
      auto e = make(expr_kind::literal, t.where);
      e->constant = value::integer(t.integer);
      next();
      return e;
    }
    case token_kind::floating: {
      auto e = make(expr_kind::literal, t.where);
      e->constant = value::floating(t.floating);
      next();
      return e;
    }
    case token_kind::op:
      if (t.text == "(") {
        next();
        if (is_op(")")) {
          next();
          return make(expr_kind::tuple, t.where);
        }
        expr_ptr inner = parse_expression(true);
        if (is_op(",")) {
          auto tuple = make(expr_kind::tuple, t.where);
          tuple->args.push_back(std::move(inner));
          while (is_op(",")) {
            next();
            if (is_op(")"))
              break;
            tuple->args.push_back(parse_expression(true));
          }
          inner = std::move(tuple);
        }
        expect_op(")");
        return inner;
      }
      if (t.text == "[") {
        next();
        auto e = make(expr_kind::list, t.where);
        while (!is_op("]")) {
          e->args.push_back(parse_expression(true));
          if (!is_op(","))
            break;
          next();
        }
        expect_op("]");
        return e;
      }
      if (t.text == "{") {
        next();
        auto e = make(expr_kind::dict, t.where);
        while (!is_op("}")) {
          e->args.push_back(parse_expression(true));
          expect_op(":");
          e->args.push_back(parse_expression(true));
          if (!is_op(","))
            break;
          next();
        }
        expect_op("}");
        return e;
      }
      break;
    default:
      break;
    }
    fail("unexpected " + show(t) + " where an expression was expected");
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      if (is_op(".")) {
        const source_position where = next().where;
        if (cur().kind == token_kind::name) {
          auto a = make(expr_kind::getattr, where);
          a->name = next().text;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().kind == token_kind::integer) {
          auto a = make(expr_kind::getitem, where);
          auto index = make(expr_kind::literal, cur().where);
          index->constant = value::integer(next().integer);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(index));
          e = std::move(a);
        } else {
          fail("expected an attribute name after '.', got " + show(cur()));
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e), expr_kind::call, "");
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_subscript(expr_ptr object) {
    const source_position where = next().where; // [
    expr_ptr parts[3];
    bool is_slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        is_slice = true;
        if (++part > 2)
          fail("a slice takes at most three parts");
        next();
        continue;
      }
      if (is_op(","))
        throw template_error(error_kind::unsupported, "tuple subscripts are not supported",
                             cur().where);
      if (parts[part])
        fail("expected ':' or ']' in a subscript, got " + show(cur()));
      parts[part] = parse_expression(true);
    }
    next(); // ]
    if (!is_slice) {
      if (!parts[0])
        fail("empty subscript");
      auto e = make(expr_kind::getitem, where);
      e->args.push_back(std::move(object));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(expr_kind::slice, where);
    e->args.push_back(std::move(object));
    for (auto& p : parts)
      e->args.push_back(std::move(p));
    return e;
  }

  /// Parses `(args...)` into a call, filter or test node whose args[0] is `subject`.
  expr_ptr parse_call(expr_ptr subject, expr_kind kind, const std::string& name) {
    auto e = make(kind, kind == expr_kind::call ? cur().where : subject->where);
    e->name = name;
    e->args.push_back(std::move(subject));
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        throw template_error(error_kind::unsupported, "argument unpacking (*, **) is not supported",
                             cur().where);
      if (cur().kind == token_kind::name && peek().kind == token_kind::op && peek().text == "=") {
        std::string key = next().text;
        next(); // =
        e->kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e->kwargs.empty())
          fail("a positional argument follows a keyword argument");
        e->args.push_back(parse_expression(true));
      }
      if (!is_op(","))
        break;
      next();
    }
    expect_op(")");
    return e;
  }

  expr_ptr parse_filter_expr(expr_ptr e) {
    while (true) {
      if (is_op("|")) {
        next();
        const token& n = cur();
        const std::string name = expect_name("a filter name");
        if (!is_known_filter(name))
          throw template_error(error_kind::unsupported, "filter '" + name + "' is not supported",
                               n.where);
        if (is_op("(")) {
          e = parse_call(std::move(e), expr_kind::filter, name);
        } else {
          auto f = make(expr_kind::filter, n.where);
          f->name = name;
          f->args.push_back(std::move(e));
          e = std::move(f);
        }
        e->where = n.where;
      } else if (is_name("is")) {
        next();
        bool negated = false;
        if (is_name("not")) {
          negated = true;
          next();
        }
        const token& n = cur();
        const std::string name = expect_name("a test name");
        if (!is_known_test(name))
          throw template_error(error_kind::unsupported, "test '" + name + "' is not supported",
                               n.where);
        if (is_op("(")) {
          e = parse_call(std::move(e), expr_kind::test, name);
        } else {
          auto t = make(expr_kind::test, n.where);
          t->name = name;
          t->args.push_back(std::move(e));
          const token& a = cur();
          const bool arg_follows =
              (a.kind == token_kind::name && a.text != "else" && a.text != "or" &&
               a.text != "and") ||
              a.kind == token_kind::string || a.kind == token_kind::integer ||
              a.kind == token_kind::floating ||
              (a.kind == token_kind::op && (a.text == "(" || a.text == "[" || a.text == "{"));
          if (arg_follows) {
            if (a.kind == token_kind::name && a.text == "is")
              fail("tests cannot be chained with 'is'");
            t->args.push_back(parse_postfix(parse_primary()));
          }
          e = std::move(t);
        }
        e->negated = negated;
        e->where = n.where;
      } else if (is_op("(")) {
        e = parse_call(std::move(e), expr_kind::call, "");
      } else {
        return e;
      }
    }
  }

  const std::vector<token>& tokens_;
  std::size_t pos_ = 0;
  int loop_depth_ = 0;
};

} // namespace

stmt_list parse(const std::vector<token>& tokens) {
  return parser(tokens).run();
}

} // namespace rlforge::chat::detail
