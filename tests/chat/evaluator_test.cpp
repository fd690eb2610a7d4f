// chat/evaluator.hpp with chat/operators.hpp and chat/globals.hpp: statements, scoping, loops,
// macros, operators, globals, and the runtime refusals.
#include "tests/chat/test_support.hpp"

#include <ctime>
#include <thread>
#include <vector>

namespace rlforge::chat::test {
namespace {

TEST(ChatEvaluator, PrintsValuesAsPythonStr) {
  EXPECT_EQ(render("{{ 1 }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 'é' }}|{{ x }}|{{ none }}|{{ true }}",
                   R"({"x": null})"),
            "1|1.0|0.30000000000000004|é|None|None|True");
  EXPECT_EQ(render("[{{ missing }}]"), "[]");
  expect_error("{{ [1] }}", "{}", error_kind::unsupported, {"list", "tojson"}, 1, 4);
  expect_error("{{ {'a': 1} }}", "{}", error_kind::unsupported, {"dict"});
  expect_error("{{ namespace() }}", "{}", error_kind::unsupported, {"namespace"});
  expect_error("{{ 'a' ~ [1] }}", "{}", error_kind::unsupported, {"list"});
}

TEST(ChatEvaluator, IfElifElse) {
  const char* t = "{% if n > 1 %}many{% elif n == 1 %}one{% else %}none{% endif %}";
  EXPECT_EQ(render(t, R"({"n": 3})"), "many");
  EXPECT_EQ(render(t, R"({"n": 1})"), "one");
  EXPECT_EQ(render(t, R"({"n": 0})"), "none");
  EXPECT_EQ(render("{% if [] or {} or '' or 0 or none or undefined_name %}t{% else %}f{% endif %}"),
            "f");
}

TEST(ChatEvaluator, ForLoopsExposeLoopVariables) {
  const char* t = "{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex0 }}"
                  "{{ loop.revindex }}{{ loop.length }}{{ loop.first }}{{ loop.last }}"
                  "{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }};{% endfor %}";
  EXPECT_EQ(render(t, R"({"xs": ["a", "b"]})"), "01122TrueFalse-b;12012FalseTruea-;");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}",
                   R"({"d": {"z": 1, "a": 2}})"),
            "z=1,a=2,");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", R"({"d": {"z": 1, "a": 2}})"), "za");
  EXPECT_EQ(render("{% for c in 'hé!' %}[{{ c }}]{% endfor %}"), "[h][é][!]");
  EXPECT_EQ(render("{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}",
                   R"({"xs": [1, 2, 3]})"),
            "2232");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in missing %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in [3] %}{{ loop.index }}{% endfor %}"
                   "{{ loop.index }}{% endfor %}"),
            "1112");
  expect_error("{% for x in 3 %}{% endfor %}", "{}", error_kind::runtime,
               {"'int' object is not iterable"}, 1, 13);
  expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", "{}", error_kind::runtime,
               {"cannot unpack 3"});
}

TEST(ChatEvaluator, SetScopesLikeJinja) {
  EXPECT_EQ(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}"),
            "51");
  EXPECT_EQ(render("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set block %}x{{ 1 + 1 }}{% endset %}[{{ block }}]"), "[x2]");
  EXPECT_EQ(render("{% set messages = messages[1:] %}{{ messages|length }}",
                   R"({"messages": [1, 2, 3]})"),
            "2");
  expect_error("{% set x = 1 %}{% set x.a = 2 %}", "{}", error_kind::runtime,
               {"only a namespace() takes attributes"}, 1, 19);
  expect_error("{% for i in [1] %}{% set loop.x = 1 %}{% endfor %}", "{}", error_kind::runtime,
               {"LoopContext"});
}

TEST(ChatEvaluator, Macros) {
  EXPECT_EQ(render("{% macro tag(name, body='-') %}<{{ name }}>{{ body }}{% endmacro %}"
                   "{{ tag('a') }}{{ tag('b', 'x') }}{{ tag(body='y', name='c') }}"),
            "<a>-<b>x<c>y");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                   "{{ f(3) }}"),
            "321");
  expect_error("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", "{}", error_kind::runtime,
               {"takes not more than 1"});
  expect_error("{% macro f(a) %}{% endmacro %}{{ f(b=1) }}", "{}", error_kind::runtime,
               {"no keyword argument 'b'"});
  expect_error("{% macro f() %}{{ varargs }}{% endmacro %}{{ f() }}", "{}", error_kind::unsupported,
               {"'varargs'"});
  expect_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "{}", error_kind::runtime,
               {"nested too deeply"});
}

TEST(ChatEvaluator, GenerationTagRendersItsBody) {
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(ChatEvaluator, ArithmeticFollowsPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 6 / 3 }}"),
            "3 -4 2 -2 3.5 2.0");
  EXPECT_EQ(render("{{ -7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2.0 ** 2 }}"),
            "-4.0 0.5 1024 0.5 4.0");
  EXPECT_EQ(render("{{ true + 1 }} {{ 'ab' * 2 }} {{ ([1] * 2)|tojson }} {{ ([1] + [2])|tojson }}"),
            "2 abab [1, 1] [1, 2]");
  EXPECT_EQ(render("{{ 1 ~ none ~ true ~ 1.5 ~ missing }}"), "1NoneTrue1.5");
  EXPECT_EQ(render("{{ -x }} {{ +x }}", R"({"x": 2.5})"), "-2.5 2.5");
  expect_error("{{ 'a' + 1 }}", "{}", error_kind::runtime,
               {"unsupported operand type(s) for +: 'str' and 'int'"}, 1, 8);
  expect_error("{{ 1 / 0 }}", "{}", error_kind::runtime, {"division by zero"});
  expect_error("{{ 1 // 0 }}", "{}", error_kind::runtime, {"division by zero"});
  expect_error("{{ 9223372036854775807 + 1 }}", "{}", error_kind::unsupported,
               {"integer overflow"});
  expect_error("{{ 2 ** 64 }}", "{}", error_kind::unsupported, {"integer overflow"});
  expect_error("{{ '%s' % 1 }}", "{}", error_kind::unsupported, {"printf-style"});
  expect_error("{{ -'a' }}", "{}", error_kind::runtime, {"bad operand type for unary -"});
  expect_error("{{ missing + 1 }}", "{}", error_kind::runtime, {"'missing' is undefined"}, 1, 12);
}

TEST(ChatEvaluator, ComparisonsAndMembershipFollowPython) {
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}"),
            "True True True True");
  EXPECT_EQ(render("{{ {'a': 1} == {'a': 1} }} {{ [1] != [1] }} {{ missing == missing }}"),
            "True False True");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} "
                   "{{ 'x' in missing }}",
                   R"({"d": {"k": 1}})"),
            "True True True True False");
  expect_error("{{ 1 in 'abc' }}", "{}", error_kind::runtime, {"requires string as left operand"});
  expect_error("{{ 1 in 5 }}", "{}", error_kind::runtime, {"'int' is not iterable"});
  expect_error("{{ 'a' < 1 }}", "{}", error_kind::runtime, {"'<' not supported"});
  expect_error("{{ missing < 1 }}", "{}", error_kind::runtime, {"'missing' is undefined"});
}

TEST(ChatEvaluator, AttributesItemsAndSlices) {
  const char* vars = R"({"m": {"role": "user", "items": "k", "n": [10, 20, 30]}, "s": "héllo"})";
  EXPECT_EQ(render("{{ m.role }} {{ m['role'] }} {{ m.n[-1] }} {{ m.n.1 }} {{ m['items'] }}", vars),
            "user user 30 20 k");
  EXPECT_EQ(render("{{ m.n[::-1]|tojson }} {{ m.n[1:]|tojson }} {{ m.n[:-1]|tojson }} "
                   "{{ m.n[5:]|tojson }} {{ s[1:3] }} {{ s[-1] }} {{ s[::-1] }}",
                   vars),
            "[30, 20, 10] [20, 30] [10, 20] [] él o olléh");
  EXPECT_EQ(
      render("{{ m.missing is defined }} {{ m.n[7] is defined }} {{ s.nope is defined }}", vars),
      "False False False");
  expect_error("{{ m.missing.x }}", vars, error_kind::runtime,
               {"'dict object' has no attribute 'missing'"}, 1, 13);
  expect_error("{{ m.n[7].x }}", vars, error_kind::runtime, {"'list object' has no element 7"});
  expect_error("{{ nothing.x }}", "{}", error_kind::runtime, {"'nothing' is undefined"});
  expect_error("{{ m.n[::0] }}", vars, error_kind::runtime, {"slice step cannot be zero"});
  expect_error("{{ 5[1:] }}", "{}", error_kind::runtime, {"not subscriptable"});
}

TEST(ChatEvaluator, CallsAndGlobals) {
  EXPECT_EQ(
      render("{{ range(3)|tojson }} {{ range(1, 7, 2)|tojson }} {{ range(3, 0, -1)|tojson }}"),
      "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
  EXPECT_EQ(render("{{ dict(a=1, b='x')|tojson }}"), R"({"a": 1, "b": "x"})");
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns['a'] }}"),
            "121");
  expect_error("{{ missing() }}", "{}", error_kind::runtime, {"'missing' is undefined"});
  expect_error("{{ 'a'() }}", "{}", error_kind::runtime, {"'str' object is not callable"});
  expect_error("{{ range(0, 5, 0) }}", "{}", error_kind::runtime, {"must not be zero"});
  for (const char* f : {"cycler", "joiner", "lipsum"})
    expect_error(std::string("{{ ") + f + "() }}", "{}", error_kind::unsupported,
                 {std::string("function '") + f + "' is not supported"});
}

TEST(ChatEvaluator, RaiseExceptionReportsTheTemplatesMessage) {
  try {
    render("\n  {{ raise_exception('Conversation roles must alternate') }}");
    FAIL() << "no exception";
  } catch (const template_error& e) {
    EXPECT_EQ(e.kind(), error_kind::raised);
    EXPECT_EQ(e.detail(), "Conversation roles must alternate");
    EXPECT_EQ(e.where().line, 2);
  }
}

TEST(ChatEvaluator, StrftimeNowFormatsTheLocalTime) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char expected[64];
  std::strftime(expected, sizeof expected, "%Y-%m-%d %b", &local);
  const std::string out = render("{{ strftime_now('%Y-%m-%d %b') }}");
  EXPECT_EQ(out, expected); // (fails only if the date changes between the two calls)
  expect_error("{{ strftime_now('%f') }}", "{}", error_kind::unsupported, {"'%f'"});
}

TEST(ChatEvaluator, ConcurrentRendersOfOneTemplateAgree) {
  const jinja_template t("{% set ns = namespace(s='') %}{% for x in xs %}{% set ns.s = ns.s ~ x %}"
                         "{% endfor %}{{ ns.s }}");
  std::vector<std::thread> threads;
  std::vector<std::string> outs(4);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k)
        outs[static_cast<std::size_t>(i)] = t.render(json{{"xs", json::array({i, i + 1, i + 2})}});
    });
  for (auto& th : threads)
    th.join();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(outs[static_cast<std::size_t>(i)],
              std::to_string(i) + std::to_string(i + 1) + std::to_string(i + 2));
}

} // namespace
} // namespace rlforge::chat::test
