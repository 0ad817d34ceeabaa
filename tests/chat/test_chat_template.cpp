// Chat templates: byte-identical output against transformers' jinja2 rendering
// (tests/fixtures/chat_templates/cases.json, made by scripts/make_chat_template_fixtures.py),
// plus the error paths: syntax errors with line numbers, unknown filters, raise_exception,
// and runaway templates stopped by the work/size/depth caps.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace strata {
namespace {

using json = nlohmann::ordered_json;

std::string fixture_dir() {
  return std::string(STRATA_FIXTURE_DIR) + "/chat_templates/";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatTemplateOptions fixed_clock() {
  ChatTemplateOptions o;
  o.now = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_hour = 9;
    tm.tm_min = 30;
    tm.tm_wday = 5;
    tm.tm_yday = 207;
    return tm;
  };
  return o;
}

TEST(ChatTemplate, MatchesTransformersOnEveryFixtureCase) {
  std::string text = read_file(fixture_dir() + "cases.json");
  ASSERT_FALSE(text.empty());
  json cases = json::parse(text);
  ASSERT_GT(cases.size(), 100u);
  int passed = 0, failed = 0;
  for (const auto& c : cases) {
    std::string name = c["template"].get<std::string>() + " / " +
                       c["conversation"].get<std::string>() +
                       (c["add_generation_prompt"].get<bool>() ? " +gen" : "") +
                       (c["tools"].is_null() ? "" : " +tools") + " " + c["extra"].dump();
    std::string tmpl = read_file(fixture_dir() + c["template"].get<std::string>());
    auto r = apply_chat_template(tmpl, c["messages"], c["add_generation_prompt"].get<bool>(), "<s>",
                                 "</s>", c["tools"], c["extra"], fixed_clock());
    if (c.contains("expected")) {
      if (!r.ok()) {
        ADD_FAILURE() << name << ": " << r.status().to_string();
        ++failed;
        continue;
      }
      if (*r != c["expected"].get<std::string>()) {
        ADD_FAILURE() << name << "\n--- expected ---\n"
                      << c["expected"].get<std::string>() << "\n--- got ---\n"
                      << *r;
        ++failed;
        continue;
      }
    } else {
      if (r.ok()) {
        ADD_FAILURE() << name << ": expected error '" << c["expected_error"].get<std::string>()
                      << "', rendered:\n"
                      << *r;
        ++failed;
        continue;
      }
      if (c["error_type"] == "TemplateError") {
        EXPECT_NE(r.status().message().find(c["expected_error"].get<std::string>()),
                  std::string::npos)
            << name << ": " << r.status().message();
      }
    }
    ++passed;
  }
  std::printf("chat template fixture cases: %d identical, %d failed (of %zu)\n", passed, failed,
              cases.size());
}

Result<std::string> render(const std::string& src, const json& ctx = json::object(),
                           const ChatTemplateOptions& o = {}) {
  auto t = ChatTemplate::parse(src);
  if (!t.ok()) return t.status();
  return t->render(ctx, o);
}

std::string render_ok(const std::string& src, const json& ctx = json::object()) {
  auto r = render(src, ctx);
  EXPECT_TRUE(r.ok()) << src << ": " << r.status().to_string();
  return r.ok() ? *r : "";
}

TEST(ChatTemplate, Expressions) {
  EXPECT_EQ(render_ok("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}"),
            "3 -4 3.5 2 1024");
  EXPECT_EQ(render_ok("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1.0 }} {{ 1e-5 }}"),
            "1e+20 0.30000000000000004 1.0 1e-05");
  EXPECT_EQ(render_ok("{{ [1, 'a', none, true, {'k': [1.5]}] }}"),
            "[1, 'a', None, True, {'k': [1.5]}]");
  EXPECT_EQ(render_ok("{{ 'héllo'[::-1] }}|{{ 'abcdef'[1:5:2] }}|{{ [1,2,3][-2:] }}"),
            "olléh|bd|[2, 3]");
  EXPECT_EQ(render_ok("{{ 'a' ~ none ~ 1.5 }}{{ x if false }}{{ 'y' if 1 else 'n' }}"),
            "aNone1.5y");
  EXPECT_EQ(render_ok("{{ 'b' in 'abc' }} {{ 2 not in [1] }} {{ 1 < 2 < 3 }} {{ 1 == 1.0 }}"),
            "True True True True");
  EXPECT_EQ(render_ok("{{ '\\u00e9\\n\\x41' }}"), "\xc3\xa9\nA");
  EXPECT_EQ(render_ok("{{ 'a,b,,c'.split(',') }} {{ ' x '.strip() }} {{ 'ab'.upper() }}"),
            "['a', 'b', '', 'c'] x AB");
  EXPECT_EQ(render_ok("{{ {'b': 1, 'a': 'é'} | tojson }} {{ [1, [2]] | tojson(indent=2) }}"),
            "{\"b\": 1, \"a\": \"é\"} [\n  1,\n  [\n    2\n  ]\n]");
}

TEST(ChatTemplate, Statements) {
  EXPECT_EQ(render_ok("{% for x in [1,2,3,4] if x is odd %}{{ loop.index }}/{{ loop.length }}{{ "
                      "',' if not loop.last }}{% endfor %}"),
            "1/2,2/2");
  EXPECT_EQ(render_ok("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(render_ok("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render_ok("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == "
                      "4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(render_ok("{% set ns = namespace(n=0) %}{% for x in range(3) %}{% set ns.n = ns.n + x "
                      "%}{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(render_ok("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ "
                      "greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(render_ok("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[block 2]");
  EXPECT_EQ(render_ok("  {%- if true %}\n  a\n  {% endif %}\nb {{- '  c' }}"), "  a\nb  c");
}

TEST(ChatTemplate, Undefined) {
  EXPECT_EQ(
      render_ok("[{{ nope }}]{{ nope is defined }}{{ nope | length }}{{ nope | default('d') }}"),
      "[]False0d");
  EXPECT_EQ(render_ok("{{ d.missing is defined }}", json{{"d", json::object()}}), "False");
  auto r = render("{{ nope.attr }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'nope' is undefined"), std::string::npos);
  r = render("{{ nope.strip() }}");
  EXPECT_FALSE(r.ok());
  r = render("{% set l = [] %}{{ l.append(1) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unsafe"), std::string::npos);
}

TEST(ChatTemplate, ErrorsCarryLineNumbers) {
  auto r = render("line one\n{{ x | foo }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "chat template: line 2: unknown filter 'foo'");
  r = render("a\nb\n{% if x %}never closed");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("endif"), std::string::npos);
  r = render("{{ 1 +* 2 }}");
  EXPECT_FALSE(r.ok());
  r = render("{% frobnicate %}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown tag 'frobnicate'"), std::string::npos);
  r = render("\n\n\n{{ raise_exception('Roles must alternate') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "chat template: line 4: Roles must alternate");
  r = render("{{ 'unterminated }}");
  EXPECT_FALSE(r.ok());
  r = render("{% break %}");
  EXPECT_FALSE(r.ok());
}

TEST(ChatTemplate, RunawayTemplatesAreCapped) {
  auto r =
      render("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  r = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("recursion"), std::string::npos) << r.status().message();
  r = render("{{ 'x' * 1000000000 }}");
  EXPECT_FALSE(r.ok());
  r = render(
      "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% "
      "endfor %}");
  EXPECT_FALSE(r.ok());
  r = render("{{ range(1000000) }}");
  EXPECT_FALSE(r.ok());
  std::string deep(5000, '(');
  r = render("{{ " + deep + "1" + std::string(5000, ')') + " }}");
  EXPECT_FALSE(r.ok());
  std::string nested;
  for (int k = 0; k < 1000; ++k) nested += "{% if true %}";
  r = render(nested);
  EXPECT_FALSE(r.ok());
}

TEST(ChatTemplate, StrftimeUsesInjectedClock) {
  auto t = ChatTemplate::parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  auto r = t->render(json::object(), fixed_clock());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "26 Jul 2024");
}

}  // namespace
}  // namespace strata
