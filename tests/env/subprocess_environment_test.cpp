// env/subprocess_environment.hpp and env/process.hpp: the Python example over the protocol, and
// every way a child can misbehave. Each test is bounded in time and leaves no process behind.
#include "env/subprocess_environment.hpp"

#include <chrono>

#include "env/number_guess.hpp"
#include "tests/env/test_support.hpp"

namespace rlforge::env::test {
namespace {

using clock = std::chrono::steady_clock;

class EnvSubprocess : public env_test {};

TEST_F(EnvSubprocess, PythonExampleRoundTripMatchesTheCppGame) {
  RLFORGE_REQUIRE_PYTHON();
  subprocess_environment py(guess_number());
  track(py.pid());
  number_guess cpp;
  for (int64_t seed : {0, 1, 7, 123456789}) {
    reset_request r;
    r.seed = seed;
    r.task = {{"max_turns", 6}};
    const auto a = py.reset(r);
    const auto b = cpp.reset(r);
    EXPECT_EQ(a.observation, b.observation);
    EXPECT_EQ(a.info, b.info);
    // Binary search from the observations alone: the reward comes from the text.
    int lo = 1, hi = 100;
    for (int turn = 0; turn < 6; ++turn) {
      const int guess = (lo + hi) / 2;
      const std::string action = "My guess is " + std::to_string(guess) + ".";
      const auto x = py.step(action);
      const auto y = cpp.step(action);
      EXPECT_EQ(x.observation, y.observation) << "seed " << seed;
      EXPECT_EQ(x.reward, y.reward);
      EXPECT_EQ(x.done, y.done);
      EXPECT_EQ(x.info, y.info);
      if (x.done)
        break;
      if (x.observation.rfind("Higher", 0) == 0)
        lo = guess + 1;
      else
        hi = guess - 1;
    }
  }
  reset_request r;
  r.task = {{"secret", 9}};
  py.reset(r);
  const auto s = py.step("héllo wörld 🌍 no number");
  EXPECT_EQ(s.observation, "I could not find a number in your answer.");
  const auto win = py.step("it is 9");
  EXPECT_EQ(win.reward, 1.0);
  EXPECT_TRUE(win.done);
  expect_env_error([&] { py.step("9"); }, failure::usage, {"without a running episode"});
  py.close();
  EXPECT_FALSE(py.usable());
  EXPECT_EQ(py.pid(), -1);
}

TEST_F(EnvSubprocess, ThePythonExamplesToolLatencyDelaysStepsAndChangesNoReply) {
  RLFORGE_REQUIRE_PYTHON();
  subprocess_environment py(guess_number());
  track(py.pid());
  reset_request plain;
  plain.seed = 5;
  reset_request slow = plain;
  slow.task = {{"tool_latency_ms", {60, 60}}};
  const auto a = py.reset(plain);
  const auto fast_step = py.step("50");
  const auto b = py.reset(slow);
  const auto t0 = std::chrono::steady_clock::now();
  const auto slow_step = py.step("50");
  // It sleeps at least the latency asked for (an upper bound would depend on the machine).
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(60));
  EXPECT_EQ(a.observation, b.observation);
  EXPECT_EQ(fast_step.observation, slow_step.observation);
  EXPECT_EQ(fast_step.reward, slow_step.reward);
  for (const char* bad : {R"([70, 60])", R"([-1, 5])", R"([1])", R"("fast")"}) {
    reset_request r;
    r.task = {{"tool_latency_ms", nlohmann::json::parse(bad)}};
    expect_env_error([&] { py.reset(r); }, failure::environment,
                     {"task.tool_latency_ms must be [lo, hi] with 0 <= lo <= hi <= 60000"});
  }
  EXPECT_TRUE(py.usable());
}

TEST_F(EnvSubprocess, EnvironmentErrorsFailTheEpisodeButNotTheProcess) {
  RLFORGE_REQUIRE_PYTHON();
  subprocess_environment py(guess_number());
  track(py.pid());
  reset_request bad;
  bad.task = {{"secret", "seven"}};
  expect_env_error([&] { py.reset(bad); }, failure::environment,
                   {"refused 'reset'", "ValueError: task.secret must be an integer"});
  EXPECT_TRUE(py.usable());
  reset_request good;
  good.task = {{"secret", 3}};
  py.reset(good);
  EXPECT_TRUE(py.step("3").done);

  subprocess_environment e(misbehaving("env_error"));
  track(e.pid());
  e.reset({});
  expect_env_error([&] { e.step("x"); }, failure::environment, {"action not understood"});
  expect_env_error([&] { e.step("x"); }, failure::usage, {"call reset first"});
  e.reset({});
  EXPECT_TRUE(e.usable());
}

TEST_F(EnvSubprocess, ConfiguresArgumentsEnvironmentAndWorkingDirectory) {
  RLFORGE_REQUIRE_PYTHON();
  auto o = misbehaving("echo_setup");
  o.process.argv.push_back("--flag=1");
  o.process.working_directory = "/tmp";
  o.process.environment["RLFORGE_TEST_VAR"] = "value with spaces";
  {
    subprocess_environment e(o);
    track(e.pid());
    const auto r = e.reset({});
    EXPECT_EQ(r.info["cwd"], "/tmp");
    EXPECT_EQ(r.info["var"], "value with spaces");
    EXPECT_EQ(r.info["argv"], nlohmann::json::array({"echo_setup", "--flag=1"}));
    EXPECT_FALSE(r.info["home"].is_null()); // inherited
  }
  o.process.inherit_environment = false;
  subprocess_environment clean(o);
  track(clean.pid());
  const auto r = clean.reset({});
  EXPECT_TRUE(r.info["home"].is_null());
  EXPECT_EQ(r.info["var"], "value with spaces");
}

TEST_F(EnvSubprocess, SpawnFailuresNameTheProgram) {
  subprocess_options o;
  o.process.argv = {"/nonexistent/env-binary"};
  expect_env_error([&] { subprocess_environment e(o); }, failure::spawn,
                   {"cannot start '/nonexistent/env-binary'", "No such file"});
  o.process.argv = {"no-such-program-on-path-xyz"};
  expect_env_error([&] { subprocess_environment e(o); }, failure::spawn,
                   {"no-such-program-on-path-xyz"});
  o.process.argv = {"/bin/sh", "-c", "true"};
  o.process.working_directory = "/nonexistent-dir";
  expect_env_error([&] { subprocess_environment e(o); }, failure::spawn, {"in '/nonexistent-dir'"});
  o.process.argv = {};
  expect_env_error([&] { subprocess_environment e(o); }, failure::spawn, {"empty command"});
}

TEST_F(EnvSubprocess, HandshakeFailures) {
  RLFORGE_REQUIRE_PYTHON();
  auto o = misbehaving("no_handshake");
  o.handshake_timeout = std::chrono::milliseconds(1500);
  const auto t0 = clock::now();
  expect_env_error([&] { subprocess_environment e(o); }, failure::timeout,
                   {"waiting for the handshake", "no reply in time", "process group was killed"});
  EXPECT_LT(clock::now() - t0, std::chrono::seconds(10));
  expect_env_error([&] { subprocess_environment e(misbehaving("bad_handshake")); },
                   failure::handshake, {"not a JSON object", "'hello there'"});
  expect_env_error([&] { subprocess_environment e(misbehaving("wrong_version")); },
                   failure::handshake, {"version 2 is not supported"});
  expect_env_error([&] { subprocess_environment e(misbehaving("crash_before_handshake")); },
                   failure::handshake,
                   {"closed its stdout before the handshake", "cannot load the task file"});
  subprocess_options g;
  g.process.argv = {children_dir + "/garbage.sh"};
  expect_env_error([&] { subprocess_environment e(g); }, failure::handshake,
                   {"'Usage: garbage.sh [options]'", "error: no such option"});
}

/// Starts `mode`, resets, steps once; expects the step to fail with `kind` and `parts`, the
/// environment to be unusable and its process group gone.
void expect_step_failure(subprocess_options o, failure kind,
                         std::initializer_list<std::string> parts) {
  subprocess_environment e(std::move(o));
  const pid_t group = e.pid();
  e.reset({});
  expect_env_error([&] { e.step("x"); }, kind, parts);
  EXPECT_FALSE(e.usable());
  EXPECT_TRUE(group_gone(group));
  expect_env_error([&] { e.reset({}); }, failure::usage, {"closed or failed"});
}

TEST_F(EnvSubprocess, GarbageRepliesFailTheEpisodeWithTheReason) {
  RLFORGE_REQUIRE_PYTHON();
  expect_step_failure(misbehaving("wrong_id"), failure::protocol, {"carries id 3 (wrong id)"});
  expect_step_failure(misbehaving("missing_fields"), failure::protocol, {"lacks \"done\""});
  expect_step_failure(misbehaving("wrong_types"), failure::protocol, {"\"reward\" is a string"});
  expect_step_failure(misbehaving("invalid_utf8"), failure::protocol,
                      {"not valid UTF-8", "\\xff\\xfe"});
  auto huge = misbehaving("huge_line");
  huge.max_line_bytes = 1 << 20;
  expect_step_failure(huge, failure::protocol, {"exceeds the limit of 1048576 bytes"});
  {
    subprocess_environment e(misbehaving("garbage_on_reset"));
    expect_env_error([&] { e.reset({}); }, failure::protocol,
                     {"'reset' (id 1) is not JSON", "'this is not json'"});
  }
  subprocess_environment e(misbehaving("not_object"));
  expect_env_error([&] { e.reset({}); }, failure::protocol, {"is a JSON array, not an object"});
}

TEST_F(EnvSubprocess, ACrashMidEpisodeQuotesTheStderrTail) {
  RLFORGE_REQUIRE_PYTHON();
  expect_step_failure(
      misbehaving("exit_mid_episode"), failure::crashed,
      {"closed its stdout instead of answering 'step' (id 2)", "exit code 3", "fatal: boom"});
}

TEST_F(EnvSubprocess, AHungChildIsKilledAtTheTimeoutWithItsWholeGroup) {
  RLFORGE_REQUIRE_PYTHON();
  auto o = misbehaving("hang_on_step");
  o.call_timeout = std::chrono::milliseconds(1500);
  const auto t0 = clock::now();
  expect_step_failure(
      o, failure::timeout,
      {"no reply to 'step' (id 2) within 1500 ms", "process group was killed", "thinking forever"});
  EXPECT_LT(clock::now() - t0, std::chrono::seconds(10));

  // A shell child with a grandchild in its group: both must go.
  subprocess_options sh;
  sh.process.argv = {children_dir + "/hang.sh"};
  sh.call_timeout = std::chrono::milliseconds(1000);
  subprocess_environment e(sh);
  const pid_t group = e.pid();
  track(group);
  expect_env_error([&] { e.reset({}); }, failure::timeout, {"within 1000 ms"});
  EXPECT_TRUE(group_gone(group));
}

TEST_F(EnvSubprocess, AChattyChildDoesNotBlock) {
  RLFORGE_REQUIRE_PYTHON();
  subprocess_environment e(misbehaving("stderr_flood"));
  track(e.pid());
  e.reset({});
  const auto s = e.step("x");
  EXPECT_EQ(s.observation, "ok");
  EXPECT_TRUE(s.done);
}

TEST_F(EnvSubprocess, CloseAndDestructionReapTheProcess) {
  RLFORGE_REQUIRE_PYTHON();
  pid_t group = -1;
  {
    subprocess_environment e(guess_number());
    group = e.pid();
    e.reset({});
    // destroyed mid-episode without close()
  }
  EXPECT_TRUE(group_gone(group));
  subprocess_environment e(misbehaving("hang_on_step"));
  group = e.pid();
  e.close();
  e.close(); // idempotent
  EXPECT_TRUE(group_gone(group));
  expect_env_error([&] { e.step("x"); }, failure::usage, {"closed or failed"});
}

TEST_F(EnvSubprocess, ProcessReadsLinesWithDeadlines) {
  process_spec spec;
  spec.argv = {"/bin/sh", "-c", "printf 'one\\ntwo\\n'; echo err >&2; read x; echo got:$x"};
  child_process p(spec);
  const auto soon = [] { return clock::now() + std::chrono::seconds(10); };
  EXPECT_EQ(p.read_line(soon(), 100), "one");
  EXPECT_EQ(p.read_line(soon(), 100), "two");
  p.write_line("hi", soon());
  EXPECT_EQ(p.read_line(soon(), 100), "got:hi");
  EXPECT_EQ(p.read_line(soon(), 100), std::nullopt);
  EXPECT_EQ(p.terminate(std::chrono::seconds(5)), "exit code 0");
  EXPECT_EQ(p.stderr_tail(), "err\n");
}

} // namespace
} // namespace rlforge::env::test
