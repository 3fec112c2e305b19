// The Jinja subset, one feature at a time. Expected renders are what jinja2 3.x gives in the
// environment transformers uses (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks), worked
// out from jinja2's lexer rules and Python's str(), repr() and json.dumps().
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace jambo::chat_template {
namespace {

using test::render;

TEST(JinjaWhitespace, TrimBlocksDropsTheNewlineAfterABlockTag) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(render("{# note #}\nx"), "x");
  EXPECT_EQ(render("{{ 'a' }}\nb"), "a\nb");  // not after a variable tag
}

TEST(JinjaWhitespace, LstripBlocksStripsBlanksBeforeABlockTagOnItsLine) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");
  EXPECT_EQ(render("  {{ 'a' }}"), "  a");                                              // not before a variable tag
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");                              // text before it on the line
  EXPECT_EQ(render("{{ 'a' }} {% if true %}b{% endif %}"), "a b");                      // nor after a variable tag
  EXPECT_EQ(render("{% if true %}\n    {% if true %}x{% endif %}\n{% endif %}"), "x");  // line start after trim
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");                             // '+' keeps the blanks
}

TEST(JinjaWhitespace, MinusStripsAllWhitespaceOnItsSide) {
  EXPECT_EQ(render("a  \n {%- if true -%} \n b \n {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(render("x \n {{- 'a' -}} \n y"), "xay");
  EXPECT_EQ(render("x \n {#- c -#} \n y"), "xy");
}

TEST(JinjaWhitespace, OneFinalNewlineIsDroppedAndLineEndingsAreNormalized) {
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
}

TEST(JinjaWhitespace, RawBlocksAreNotInterpreted) {
  EXPECT_EQ(render("{% raw %}{{ x }}{% if %}{% endraw %}!"), "{{ x }}{% if %}!");
}

TEST(JinjaLiterals, PrintAsPythonStrDoes) {
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true ~ False }}"), "a1NoneTrueFalse");
  EXPECT_EQ(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 2.5e-5 }} {{ 123.456 }}"),
            "1.0 0.30000000000000004 1e+20 2.5e-05 123.456");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5] }}"), "[1, 'a', None, True, 1.5]");
  EXPECT_EQ(render("{{ {'a': 1, 'b': [2]} }} {{ (1,) }} {{ (1, 2) }} {{ () }}"), "{'a': 1, 'b': [2]} (1,) (1, 2) ()");
  EXPECT_EQ(render(R"({{ ["it's", 'say "hi"', 'a\nb'] }})"), R"(["it's", 'say "hi"', 'a\nb'])");
  EXPECT_EQ(render(R"({{ 'tab\there' }}|{{ "\u00e9\x41" }}|{{ 'a' 'b' }}|{{ 1_000 }})"),
            "tab\there|\xc3\xa9"
            "A|ab|1000");
}

TEST(JinjaExpressions, ArithmeticFollowsPython) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }}"), "7 9 1024 3.5 2.0");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }}"), "3 -4 2 -2 3.0");
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [0] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ -(3) }} {{ true + 1 }}"),
            "ababab [0, 0] [1, 2] ab -3 2");
}

TEST(JinjaExpressions, LogicReturnsTheDecidingOperand) {
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} {{ not '' }} {{ undefined_name or 'd' }}"),
            "x b [] True d");
  // The right side is not evaluated when the left decides (it would raise here).
  EXPECT_EQ(render("{{ false and x.y.z }} {{ true or x.y.z }}"), "False True");
}

TEST(JinjaExpressions, ComparisonsChainAndTestMembership) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }}"),
            "True False True True True");
  EXPECT_EQ(render("{{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 1 in [1.0] }}"),
            "True True True True");
  EXPECT_EQ(render("{{ 'b' < 'ab' }} {{ [1, 2] < [1, 3] }}"), "False True");
}

TEST(JinjaExpressions, ConditionalExpression) {
  EXPECT_EQ(render("{{ 'y' if true else 'n' }}|{{ 'y' if false else 'n' }}|{{ 'y' if false }}|"), "y|n||");
  EXPECT_EQ(render("{{ 'a' if 0 else 'b' if 1 else 'c' }}"), "b");
}

TEST(JinjaExpressions, AttributesSubscriptsAndSlices) {
  const nlohmann::ordered_json vars = {{"m", {{"role", "user"}, {"items", 5}}}, {"l", {1, 2, 3, 4}}};
  EXPECT_EQ(render("{{ m.role }} {{ m['role'] }} [{{ m.missing }}] [{{ m['missing'] }}]", vars), "user user [] []");
  // Attribute access finds dict methods first, subscripts find keys first, as in jinja2.
  EXPECT_EQ(render("{{ m['items'] }} {{ m.items is callable }}", vars), "5 True");
  EXPECT_EQ(render("{{ l[1:] }} {{ l[::-1] }} {{ l[-1] }} {{ l[1:3] }} {{ l[::2] }} {{ l[10:] }} [{{ l[10] }}]", vars),
            "[2, 3, 4] [4, 3, 2, 1] 4 [2, 3] [1, 3] [] []");
  EXPECT_EQ(render("{{ 'h\xc3\xa9llo'[:2] }} {{ 'h\xc3\xa9llo'|length }} {{ 'abc'[-1] }} {{ l.0 }}", vars),
            "h\xc3\xa9 5 c 1");
}

TEST(JinjaStatements, IfElifElse) {
  const std::string source = "{% if n > 1 %}many{% elif n == 1 %}one{% else %}none{% endif %}";
  EXPECT_EQ(render(source, {{"n", 2}}), "many");
  EXPECT_EQ(render(source, {{"n", 1}}), "one");
  EXPECT_EQ(render(source, {{"n", 0}}), "none");
}

TEST(JinjaStatements, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}{{ loop.revindex }} {% endfor %}"),
            "10TrueFalse33 21FalseFalse32 32FalseTrue31 ");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}"), "-2 1-3 2- ");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
}

TEST(JinjaStatements, ForLoopElseFilterUnpackingAndControl) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "b=1;a=2;");
  EXPECT_EQ(render("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}"), "ba");  // insertion order
  EXPECT_EQ(render("{% for x in range(6) if x is even %}{{ x }}/{{ loop.length }},{% endfor %}"), "0/3,2/3,4/3,");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(render("{% for c in 'h\xc3\xa9' %}[{{ c }}]{% endfor %}"), "[h][\xc3\xa9]");
}

TEST(JinjaStatements, SetIsScopedToTheLoopIteration) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "12121");
  EXPECT_EQ(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");  // if makes no scope
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% set x %}a{{ 1 }}{% endset %}{{ x }}|"), "a1|");
}

TEST(JinjaStatements, NamespaceCarriesValuesOutOfLoops) {
  EXPECT_EQ(render("{% set ns = namespace(found=false, n=0) %}{% for i in [1, 2] %}{% set ns.found = true %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.found }} {{ ns.n }} {{ ns.other is defined }}"),
            "True 3 False");
}

TEST(JinjaStatements, MacrosTakeDefaultsKeywordsAndStarArguments) {
  const std::string macro = "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}";
  EXPECT_EQ(render(macro + "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(*['Cy', '.']) }}"),
            "Hi Bob! Hi Al? Hi Cy.");
  EXPECT_EQ(render("{% macro f(a) %}[{{ a }}]{% endmacro %}{{ f() }}"), "[]");  // a missing argument is undefined
  // A macro sees the template's top level when called, not the caller's loop variables.
  EXPECT_EQ(
      render("{% macro f() %}{{ g }}{{ i }}{% endmacro %}{% set g = 'G' %}{% for i in [1] %}{{ f() }}{% endfor %}"),
      "G");
  // Macros are values: in lists, passed around, called later; their output is a string.
  EXPECT_EQ(render("{% macro a(x) %}<{{ x }}>{% endmacro %}{% set fs = [a] %}{{ fs[0](*[1]) ~ '|' ~ (a(2) + '!') }}"),
            "<1>|<2>!");
}

TEST(JinjaStatements, GenerationBlocksRenderInPlace) {
  EXPECT_EQ(render("a{% generation %}b{% endgeneration %}c"), "abc");
}

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(
      render(
          "{{ '  x \n'|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'abc'|upper }}{{ 'ABC'|lower }}|{{ 'hello world-foo'|title }}"
          "|{{ 'source_url'|title }}|{{ 'hELLO'|capitalize }}|{{ 'aXa'|replace('a', 'b') }}"),
      "x|a|ABCabc|Hello World-Foo|Source_url|Hello|bXb");
  EXPECT_EQ(render("{{ none|string }} {{ 12|string + '!' }} {{ 'abc'|reverse }} {{ '\xc3\x89T\xc3\xa9'|lower }}"),
            "None 12! cba \xc3\xa9t\xc3\xa9");
  EXPECT_EQ(render("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
}

TEST(JinjaFilters, DefaultLengthAndConversions) {
  EXPECT_EQ(render("{{ missing|default('d') }} {{ ''|default('e', true) }} {{ ''|default('e') }}| {{ none|d('n') }}"),
            "d e | None");
  EXPECT_EQ(render("{{ [1, 2]|length }} {{ 'h\xc3\xa9'|length }} {{ {'a': 1}|count }} {{ missing|length }}"),
            "2 2 1 0");
  EXPECT_EQ(render("{{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '2.5'|float }} {{ 3|float }}"),
            "43 3 0 7 2.5 3.0");
  EXPECT_EQ(render("{{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3|round }}"), "3 2.57 2.0 3");
}

TEST(JinjaFilters, Sequences) {
  EXPECT_EQ(render("{{ [1, 2, 3]|join('-') }} {{ [1, 2]|first }} {{ [1, 2]|last }} {{ 'ab'|list }} {{ [3, 1, 2]|sort }}"
                   " {{ ['b', 'A', 'a']|sort }} {{ [1, 2, 1]|unique|list }} {{ [1, 2, 3]|sum }} {{ [2, 5, 1]|max }}"),
            "1-2-3 1 2 ['a', 'b'] [1, 2, 3] ['A', 'a', 'b'] [1, 2] 6 5");
  const nlohmann::ordered_json vars = {{"people", {{{"n", "a"}, {"age", 3}}, {{"n", "b"}, {"age", 1}}}}};
  EXPECT_EQ(render("{{ people|map(attribute='n')|join(',') }} {{ ['a', 'b']|map('upper')|list }} "
                   "{{ people|selectattr('age', 'gt', 2)|map(attribute='n')|list }} "
                   "{{ people|rejectattr('age', 'gt', 2)|map(attribute='n')|first }} "
                   "{{ people|sort(attribute='age')|map(attribute='n')|join }} {{ [0, 1, 2]|select|list }} "
                   "{{ [1, 2, 3]|reject('odd')|list }} {{ people|join(', ', attribute='n') }}",
                   vars),
            "a,b ['A', 'B'] ['a'] b ba [1, 2] [2] a, b");
  EXPECT_EQ(render("{% for k, v in {'x': 1, 'y': 2}|items %}{{ k }}{{ v }}{% endfor %}"), "x1y2");
}

TEST(JinjaFilters, ToJsonIsPythonsJsonDumps) {
  const nlohmann::ordered_json vars = {{"v", {{"b", {1, 2.5, "\xc3\xa9\"\n"}}, {"a", nullptr}, {"c", true}}}};
  EXPECT_EQ(render("{{ v|tojson }}", vars), R"({"b": [1, 2.5, "é\"\n"], "a": null, "c": true})");
  EXPECT_EQ(render("{{ v|tojson(indent=2) }}", vars),
            "{\n  \"b\": [\n    1,\n    2.5,\n    \"\xc3\xa9\\\"\\n\"\n  ],\n  \"a\": null,\n  \"c\": true\n}");
  EXPECT_EQ(render("{{ v|tojson(sort_keys=true, separators=(',', ':')) }}", vars),
            R"({"a":null,"b":[1,2.5,"é\"\n"],"c":true})");
  EXPECT_EQ(render("{{ 'é'|tojson(ensure_ascii=true) }} {{ [[], {}]|tojson(indent=2) }} {{ '<&>'|tojson }}"),
            "\"\\u00e9\" [\n  [],\n  {}\n] \"<&>\"");
}

TEST(JinjaTests, TypeAndValueTests) {
  EXPECT_EQ(render("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }}"
                   " {{ [] is iterable }} {{ 'a' is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 1 is number }}"),
            "False True True True True True True True True True");
  EXPECT_EQ(
      render("{{ true is boolean }} {{ 1 is boolean }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is integer }}"
             " {{ 6 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 2 is gt 1 }} {{ 'x' is eq 'x' }} {{ 'ab' is lower }}"),
      "True False True True False True True True True True");
  EXPECT_EQ(render("{{ [] is not none }} {{ x is not defined }} {{ none is sameas none }} {{ 'upper' is filter }}"),
            "True True True True");
}

TEST(JinjaMethods, StringAndDictMethods) {
  EXPECT_EQ(
      render("{{ ' a '.strip() }}|{{ 'xax'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|"
             "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'a,b'.split(',') }} "
             "{{ ' a b  c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x'.upper() }} {{ 'aXa'.replace('a', 'b') }}"),
      "a|a|a | a|True True ['a', 'b'] ['a', 'b', 'c'] ['a', 'b c'] X bXb");
  EXPECT_EQ(
      render("{{ 'hello world'.title() }} {{ 'they\\'re'.title() }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }}"
             " {{ '-'.join(['a', 'b']) }} {{ 'ab'.lower() }}"),
      "Hello World They'Re 1 2 a-b ab");
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('b', 2) }} {{ d.get('b') }} {{ d.keys()|list }} {{ d.values()|list }}"
                   " {{ d.items()|list }}",
                   {{"d", {{"a", 1}}}}),
            "1 2 None ['a'] [1] [('a', 1)]");
}

TEST(JinjaGlobals, RangeNamespaceDict) {
  EXPECT_EQ(render("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ range(0)|list }}"),
            "[0, 1, 2] [1, 3, 5] [3, 2, 1] []");
  EXPECT_EQ(render("{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}"), "{'a': 1, 'b': 'x'} 1");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplatesMessage) {
  EXPECT_EQ(test::error_of(
                [] { render("{% if true %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}"); }),
            "Conversation roles must alternate");
}

TEST(JinjaErrors, ParseErrorsNameLineColumnAndWhatWasExpected) {
  EXPECT_ERROR_CONTAINS(render("a\n{% if x"), "line 2, column 1: unterminated tag: '{%' without '%}'");
  EXPECT_ERROR_CONTAINS(render("{{ x "), "unterminated tag: '{{' without '}}'");
  EXPECT_ERROR_CONTAINS(render("{# comment"), "unterminated comment");
  EXPECT_ERROR_CONTAINS(render("x\n{% if x %}a"),
                        "line 2, column 12: expected 'elif', 'else' or 'endif' to close the 'if' at line 2, found the "
                        "end of the template");
  EXPECT_ERROR_CONTAINS(render("{% for x in y %}{% endif %}"), "unexpected 'endif', expected 'else' or 'endfor'");
  EXPECT_ERROR_CONTAINS(render("{% endfor %}"), "line 1, column 4: unexpected 'endfor'");
  EXPECT_ERROR_CONTAINS(render("{{ x|frobnicate }}"), "line 1, column 6: no filter named 'frobnicate'");
  EXPECT_ERROR_CONTAINS(render("{{ x is frobnicated }}"), "no test named 'frobnicated'");
  EXPECT_ERROR_CONTAINS(render("{% include 'other.jinja' %}"), "the 'include' tag is not supported");
  EXPECT_ERROR_CONTAINS(render("{% frobnicate %}"), "unknown tag 'frobnicate'");
  EXPECT_ERROR_CONTAINS(render("{{ 'abc }}"), "unterminated string literal");
  EXPECT_ERROR_CONTAINS(render("{{ (1 + 2 }}"), "unexpected '}', expected ')'");
  EXPECT_ERROR_CONTAINS(render("{{ 1 + }}"), "expected an expression, found '}}'");
  EXPECT_ERROR_CONTAINS(render("{{ a ] }}"), "unexpected ']'");
  EXPECT_ERROR_CONTAINS(render("{{ a $ b }}"), "unexpected character '$'");
  EXPECT_ERROR_CONTAINS(render("{% break %}"), "'break' outside of a for loop");
  EXPECT_ERROR_CONTAINS(render("{% set %}"), "expected a variable name, found '%}'");
  EXPECT_ERROR_CONTAINS(render("{% for x in y recursive %}{% endfor %}"), "recursive for loops are not supported");
}

TEST(JinjaErrors, RenderErrorsNameTheLine) {
  EXPECT_ERROR_CONTAINS(render("a\nb\n{{ 1 + 'a' }}"), "line 3: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_ERROR_CONTAINS(render("{{ x.y }}"), "line 1: 'x' is undefined");
  EXPECT_ERROR_CONTAINS(render("{{ m.a.b }}", {{"m", nlohmann::ordered_json::object()}}),
                        "'dict object' has no attribute 'a'");
  EXPECT_ERROR_CONTAINS(render("{{ x + 1 }}"), "'x' is undefined");
  EXPECT_ERROR_CONTAINS(render("{{ 1 / 0 }}"), "division by zero");
  EXPECT_ERROR_CONTAINS(render("{{ 1 < 'a' }}"), "'<' not supported between instances of 'int' and 'str'");
  EXPECT_ERROR_CONTAINS(render("{{ 'a' in none }}"), "argument of type 'NoneType' is not iterable");
  EXPECT_ERROR_CONTAINS(render("{% for x in 3 %}{% endfor %}"), "'int' object is not iterable");
  EXPECT_ERROR_CONTAINS(render("{{ none|length }}"), "object of type 'NoneType' has no len()");
  EXPECT_ERROR_CONTAINS(render("{{ 'a'() }}"), "'str' object is not callable");
  EXPECT_ERROR_CONTAINS(render("{{ 'a'|trim(1, 2) }}"), "trim() takes at most 1 argument(s), 2 given");
  EXPECT_ERROR_CONTAINS(render("{% macro f(a) %}{% endmacro %}{{ f(b=1) }}"),
                        "macro 'f' takes no keyword argument 'b'");
  EXPECT_ERROR_CONTAINS(render("{% set x = 1 %}{% set x.y = 2 %}"), "cannot assign attribute on non-namespace object");
  EXPECT_ERROR_CONTAINS(render("{{ x|tojson }}"), "Object of type Undefined is not JSON serializable");
  EXPECT_ERROR_CONTAINS(render("{{ 9223372036854775807 + 1 }}"), "integer overflow");
}

TEST(JinjaLimits, RecursionIsBounded) {
  EXPECT_ERROR_CONTAINS(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                        "macro calls nested deeper than 64 levels");
}

TEST(JinjaLimits, LongLoopsAreBounded) {
  chat_template::RenderLimits limits;
  limits.max_steps = 100'000;
  EXPECT_ERROR_CONTAINS(
      render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", {}, limits),
      "the template ran for more than 100000 steps");
  EXPECT_ERROR_CONTAINS(render("{{ range(10 ** 9)|length }}"),
                        "range() of 1000000000 items is beyond the limit of 1048576");
}

TEST(JinjaLimits, OutputAndBuiltTextAreBounded) {
  chat_template::RenderLimits limits;
  limits.max_output_bytes = 10'000;
  EXPECT_ERROR_CONTAINS(render("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", {}, limits),
                        "the output is larger than 10000 bytes");
  EXPECT_ERROR_CONTAINS(render("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
                               "{% endfor %}"),
                        "a string longer than");
  EXPECT_ERROR_CONTAINS(render("{{ 'x' * 10 ** 12 }}"), "a string longer than");
  limits = {};
  limits.max_built_bytes = 1 << 20;
  EXPECT_ERROR_CONTAINS(render("{% for i in range(1000) %}{% set s = 'x' * 10000 %}{% endfor %}", {}, limits),
                        "the template built more than 1048576 bytes");
}

TEST(JinjaLimits, NestingIsBounded) {
  const std::string deep = "{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}";
  EXPECT_ERROR_CONTAINS(render(deep), "nested deeper than 100 levels");
  std::string blocks;
  for (int i = 0; i < 200; ++i) blocks += "{% if true %}";
  EXPECT_ERROR_CONTAINS(render(blocks), "nested deeper than 100 levels");
  EXPECT_ERROR_CONTAINS(render("{% set ns = namespace(l=[]) %}{% for i in range(500) %}{% set ns.l = [ns.l] %}"
                               "{% endfor %}"),
                        "a value nested deeper than 128 levels");
  nlohmann::ordered_json value = 1;
  for (int i = 0; i < 1000; ++i) value = nlohmann::ordered_json::array({std::move(value)});
  EXPECT_ERROR_CONTAINS(render("{{ v }}", {{"v", value}}), "a value nested deeper than 128 levels");
  EXPECT_ERROR_CONTAINS(render("{% set ns = namespace() %}{% set ns.me = [ns] %}"),
                        "a namespace cannot hold a namespace");
}

// Operator chains deepen the tree without deepening the parser's recursion; a hundred thousand links crashed in
// the renderer and in the tree's destructor.
TEST(JinjaLimits, OperatorChainsAreBounded) {
  const auto chain = [](const std::string& first, const std::string& link, int links) {
    std::string expression = first;
    for (int i = 0; i < links; ++i) expression += link;
    return expression;
  };
  EXPECT_EQ(render("{{ " + chain("1", " + 1", 99) + " }}"), "100");
  EXPECT_EQ(render("{{ " + chain("'a'", " ~ 'a'", 99) + " }}"), std::string(100, 'a'));
  // A chain of 99 links is 100 levels; in a list, 101.
  EXPECT_ERROR_CONTAINS(render("{{ [" + chain("1", " + 1", 99) + "] }}"), "an expression nested deeper than 100 levels");
  for (const auto& [first, link] : std::vector<std::pair<std::string, std::string>>{
           {"1", " + 1"}, {"'a'", " ~ 'a'"}, {"1", " or 1"}, {"1", " and 1"}, {"1", " * 1"}, {"1", " ** 1"},
           {"x", ".y"}, {"x", "[0]"}, {"x", ".0"}, {"x", "[1:]"}, {"range", "(1)"}, {"'a'", " | trim"}}) {
    SCOPED_TRACE(link);
    const std::string source = "{{ " + chain(first, link, 100'000) + " }}";  // clang 14 cannot capture a binding
    EXPECT_ERROR_CONTAINS(render(source), "an expression nested deeper than 100 levels");
  }
}

}  // namespace
}  // namespace jambo::chat_template
