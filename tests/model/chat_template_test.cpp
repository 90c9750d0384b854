// Chat templates: the interpreter's rules on small templates, then every real template in
// ../shared/data/templates/ and the llama.cpp tree's models/templates/ over the conversations
// in tests/data/chat/, byte for byte against python3-jinja2 (tests/model/chat_template_reference.py).
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

std::string render(std::string_view source, std::string_view input_json = R"({"messages": []})") {
  auto t = ChatTemplate::parse(source);
  if (!t) return "parse error: " + t.status().message();
  auto in = parse_chat_input(input_json);
  if (!in) return "input error: " + in.status().message();
  auto out = t->render(*in);
  return out ? *out : "error: " + out.status().message();
}

TEST(ChatTemplate, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a  {%- if true %} b {% endif -%}  c"), "a b c");
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(render("  {{ 'x' }}"), "  x");
  EXPECT_EQ(render("a {# comment #}\nb"), "a b");
  EXPECT_EQ(render("{%+ if true %}x{% endif +%}\n"), "x");  // one trailing newline is dropped
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(ChatTemplate, PythonValuesPrintAsPythonDoes) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, 1e-5, 1e16] }}"), "[1, 'a', None, True, 1.5, 1e-05, 1e+16]");
  EXPECT_EQ(render("{{ {'a': \"it's\"} }}{{ (1,) }}"), "{'a': \"it's\"}(1,)");
  EXPECT_EQ(render("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 4 / 2 }}"),
            "3.5 3 -4 -2 1024 2.0");
  EXPECT_EQ(render("{{ 'héllo'|length }}{{ 'héllo'[1:3] }}{{ 'héllo'|upper }}{{ 'abc'[::-1] }}"), "5élHÉLLOcba");
  EXPECT_EQ(render("{{ {'b': [1, 2], 'a': 'é\"\\n'}|tojson }}"), "{\"b\": [1, 2], \"a\": \"é\\\"\\n\"}");
  EXPECT_EQ(render("{{ {'a': [1]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
}

TEST(ChatTemplate, ScopesLoopsAndMacros) {
  EXPECT_EQ(render("{% set c = 0 %}{% for i in [1,2,3] %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}"), "1110");
  EXPECT_EQ(
      render("{% set ns = namespace(c=0) %}{% for i in [1,2,3] %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}"),
      "6");
  EXPECT_EQ(
      render("{% for x in [1,2,3,4] if x != 2 %}{{ loop.index }}{{ x }}{% if loop.last %}.{% endif %}{% endfor %}"),
      "112334.");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{{ caller() if caller is defined }}{% endmacro %}"
                   "{{ m(1) }}{% call m(2, b=3) %}C{% endcall %}"),
            "1B23C");
  EXPECT_EQ(render("{% filter upper %}ab{% endfilter %}{% set x %}y{% endset %}{{ x }}"), "ABy");
}

TEST(ChatTemplate, ErrorsNameWhatFailed) {
  EXPECT_EQ(render("{{ raise_exception('Roles must alternate') }}"), "error: chat template: Roles must alternate");
  EXPECT_NE(render("{% include 'x' %}").find("unsupported tag 'include'"), std::string::npos);
  EXPECT_NE(render("{{ x|nosuchfilter }}").find("no filter named 'nosuchfilter'"), std::string::npos);
  EXPECT_EQ(render("{% if false %}{{ x|nosuchfilter }}{% endif %}ok"), "ok");  // as Jinja: checked when run
  EXPECT_NE(render("{{ [1].append(2) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(render("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  EXPECT_NE(render("{% if %}").find("syntax error"), std::string::npos);
  EXPECT_NE(render("{{ messages }}", R"({"messages": [{"content": "x"}]})").find("messages[0] has no string 'role'"),
            std::string::npos);
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The folders of real templates that exist here (the llama.cpp tree is fetched by the
// llama_tree fixture: tests/data/fetch-llama-tree.sh).
std::vector<fs::path> template_dirs() {
  std::vector<fs::path> dirs;
  const fs::path shared = fs::path(TANDEM_SOURCE_DIR) / "../shared/data/templates";
  if (fs::is_directory(shared)) dirs.push_back(shared);
  if (const char* tree = std::getenv("TANDEM_LLAMA_TREE")) {
    const fs::path llama = fs::path(tree) / "models/templates";
    if (fs::is_directory(llama)) dirs.push_back(llama);
  }
  return dirs;
}

TEST(ChatTemplate, RealTemplatesMatchPythonJinja2ByteForByte) {
  const auto dirs = template_dirs();
  if (dirs.empty())
    GTEST_SKIP() << "no templates: neither ../shared/data/templates nor $TANDEM_LLAMA_TREE/models/templates";
  if (std::system("/usr/bin/python3 -c 'import jinja2' 2>/dev/null") != 0) {
    GTEST_SKIP() << "no python3-jinja2 (scripts/install-deps.sh installs it)";
  }
  setenv("TZ", "UTC", 1);  // strftime_now() formats local time; the reference's clock is naive
  tzset();
  const fs::path conversations = fs::path(TANDEM_SOURCE_DIR) / "tests/data/chat";
  const fs::path out = fs::temp_directory_path() / ("tandem-chat-reference-" + std::to_string(getpid()));
  std::string cmd = "/usr/bin/python3 " + std::string(TANDEM_SOURCE_DIR) + "/tests/model/chat_template_reference.py " +
                    out.string() + " " + conversations.string();
  for (const auto& d : dirs) cmd += " " + d.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  std::map<std::string, ChatInput> inputs;
  for (const auto& e : fs::directory_iterator(conversations)) {
    if (e.path().extension() != ".json") continue;
    auto in = parse_chat_input(read_file(e.path()));
    ASSERT_TRUE(in) << e.path() << ": " << in.status().message();
    in->now = 1789468200;  // the reference's fixed clock: 2026-09-15 10:30:00 UTC
    inputs.emplace(e.path().stem().string(), std::move(*in));
  }
  int pairs = 0, matched = 0, raised = 0;
  std::vector<std::string> failures;
  for (size_t index = 0; index < dirs.size(); ++index) {
    for (const auto& e : fs::directory_iterator(dirs[index])) {
      if (e.path().extension() != ".jinja") continue;
      const std::string name = e.path().stem().string();
      auto t = ChatTemplate::parse(read_file(e.path()));
      for (const auto& [conv, input] : inputs) {
        ++pairs;
        const fs::path base = out / (std::to_string(index) + "-" + name + "__" + conv);
        const bool python_raised = fs::exists(base.string() + ".err");
        auto rendered = t ? t->render(input) : Result<std::string>(t.status());
        if (python_raised) {
          const std::string python_error = read_file(base.string() + ".err");
          const std::string message = python_error.substr(0, python_error.find('\n'));
          const bool template_error = python_error.find("\nTemplateError") != std::string::npos;
          if (!rendered && (!template_error || rendered.status().message().find(message) != std::string::npos)) {
            ++matched, ++raised;
            std::printf("raises  %s x %s: python: %s / tandem: %s\n", name.c_str(), conv.c_str(), message.c_str(),
                        rendered.status().message().c_str());
          } else {
            failures.push_back(name + " x " + conv + ": python raised '" + message + "', tandem " +
                               (rendered ? "rendered" : "said '" + rendered.status().message() + "'"));
          }
          continue;
        }
        const std::string expected = read_file(base.string() + ".out");
        if (rendered && *rendered == expected) {
          ++matched;
        } else {
          failures.push_back(name + " x " + conv + ": " +
                             (rendered ? "bytes differ" : "tandem said '" + rendered.status().message() + "'"));
        }
      }
    }
  }
  fs::remove_all(out);
  for (const auto& f : failures) std::printf("MISMATCH %s\n", f.c_str());
  std::printf("chat templates: %d of %d template x conversation pairs match python3-jinja2 (%d raise in both)\n",
              matched, pairs, raised);
  EXPECT_EQ(matched, pairs);
}

}  // namespace
}  // namespace tandem::model
