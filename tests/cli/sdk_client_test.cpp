// The official Tinker Python SDK (0.25) as the client of a real `rlforge serve` (issue 11): each
// TEST starts the server on a tiny random Llama, runs one client script of tests/cli/sdk/ against
// it and checks the script's exit code and its `SDK-CHECK {json}` summary line, then stops the
// server. The SDK's source and its env.sh live beside the checkout (../shared/tinker-sdk); where
// they are missing or env.sh cannot make the SDK importable (exit 1), the tests skip, naming why.
//
// Usage: sdk_client_test <rlforge binary> <scripts dir> <SDK dir>
//   RLFORGE_TINKER_SDK overrides the SDK dir; RLFORGE_SDK_PYTHON the interpreter (default
//   /usr/bin/python3, Debian's python3, which env.sh makes the SDK importable for).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "tests/cli/serve_process.hpp"

namespace {

using rlforge::cli_test::serve_process;

namespace fs = std::filesystem;

std::string rlforge_bin, scripts_dir, sdk_dir;

constexpr int script_timeout_s = 120; // one check takes a few seconds; this bounds a hang
constexpr int env_sh_timeout_s = 240; // env.sh may apt-get install the SDK's dependencies
const char* const api_key = "tml-sdk-client-test"; // the SDK wants keys starting with tml-

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tail(const std::string& s, size_t n = 4000) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

struct run_result {
  int exit_code = -1; ///< -1 when killed or not run
  bool timed_out = false;
  std::string out, err;
};

/// Runs argv (argv[0] a path) with `env` added to this process's environment, stdout and stderr
/// to files in `dir`; kills its process group (by its pid) when it outlives `timeout_s`. The
/// child also dies with this process (PR_SET_PDEATHSIG), so nothing outlives a killed test.
run_result run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
               const fs::path& dir, const std::string& tag, int timeout_s) {
  run_result r;
  const fs::path out = dir / (tag + ".out"), err = dir / (tag + ".err");
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0)
      _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    for (const auto& [k, v] : env)
      setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  if (pid < 0)
    return r;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid)
      break;
    if (done < 0)
      return r;
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!r.timed_out && WIFEXITED(status))
    r.exit_code = WEXITSTATUS(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

/// The SDK's environment, made once per run by its env.sh.
struct sdk_environment {
  enum { ready, skip, broken } state = broken;
  std::string why;        ///< for skip and broken
  std::string pythonpath; ///< for ready
  std::string python;
};

const sdk_environment& sdk() {
  static const sdk_environment env = [] {
    sdk_environment e;
    const char* over = std::getenv("RLFORGE_TINKER_SDK");
    fs::path dir = over != nullptr && *over != '\0' ? fs::path(over) : fs::path(sdk_dir);
    const char* py = std::getenv("RLFORGE_SDK_PYTHON");
    e.python = py != nullptr && *py != '\0' ? py : "/usr/bin/python3";
    std::error_code ec;
    if (!fs::exists(dir / "env.sh", ec)) {
      e.state = sdk_environment::skip;
      e.why = "no Tinker SDK at " + dir.string() + " (no env.sh there; set RLFORGE_TINKER_SDK)";
      return e;
    }
    if (access(e.python.c_str(), X_OK) != 0) {
      e.state = sdk_environment::skip;
      e.why = "no python interpreter " + e.python + " (set RLFORGE_SDK_PYTHON)";
      return e;
    }
    fs::path tmp = fs::temp_directory_path() / ("rlforge-sdk-env-" + std::to_string(getpid()));
    fs::create_directories(tmp, ec);
    auto r = run({"/bin/sh", "-c", "exec bash \"$0\"", (dir / "env.sh").string()}, {}, tmp, "env",
                 env_sh_timeout_s);
    fs::remove_all(tmp, ec);
    const std::string prefix = "export PYTHONPATH=";
    auto at = r.out.find(prefix);
    if (r.exit_code == 0 && at != std::string::npos) {
      e.state = sdk_environment::ready;
      e.pythonpath = r.out.substr(at + prefix.size());
      e.pythonpath = e.pythonpath.substr(0, e.pythonpath.find('\n'));
    } else if (r.exit_code == 1) {
      e.state = sdk_environment::skip;
      e.why =
          (dir / "env.sh").string() + " cannot make the SDK importable here: " + tail(r.err, 600);
    } else {
      e.why = (dir / "env.sh").string() + (r.timed_out ? " timed out" : " failed") + " (exit " +
              std::to_string(r.exit_code) + "): " + tail(r.err, 2000) + tail(r.out, 600);
    }
    return e;
  }();
  return env;
}

class SdkClient : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(rlforge_bin.empty() || scripts_dir.empty())
        << "usage: sdk_client_test <rlforge binary> <scripts dir> <SDK dir>";
    const auto& env = sdk();
    if (env.state == sdk_environment::skip)
      GTEST_SKIP() << env.why;
    ASSERT_EQ(env.state, sdk_environment::ready) << env.why;
    std::string tmpl = (fs::temp_directory_path() / "rlforge-sdk-client-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto made = run({rlforge_bin, "init-model", "--preset", "tiny", "--out",
                     (dir_ / "base").string(), "--seed", "1"},
                    {}, dir_, "init-model", 120);
    ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty())
      fs::remove_all(dir_, ec);
  }

  /// Runs tests/cli/sdk/<script> against a fresh server; fails naming the check's failures.
  void check(const std::string& script) {
    const auto& env = sdk();
    serve_process serve(rlforge_bin, dir_, api_key);
    ASSERT_GT(serve.port(), 0) << serve.output();
    auto r = run({env.python, (fs::path(scripts_dir) / script).string(), "--url",
                  "http://127.0.0.1:" + std::to_string(serve.port()), "--base-model", "base"},
                 {{"PYTHONPATH", env.pythonpath},
                  {"TINKER_API_KEY", api_key},
                  {"TINKER_TELEMETRY", "0"},
                  {"TINKER_SUBPROCESS_SAMPLING", "0"},
                  {"PYTHONDONTWRITEBYTECODE", "1"}},
                 dir_, script, script_timeout_s);
    std::string summary;
    for (std::istringstream lines(r.out); std::getline(lines, summary);) {
      if (summary.rfind("SDK-CHECK ", 0) == 0)
        break;
      summary.clear();
    }
    const bool passed =
        !r.timed_out && r.exit_code == 0 && summary.find("\"ok\": true") != std::string::npos;
    EXPECT_TRUE(passed) << script
                        << (r.timed_out ? " did not finish within " +
                                              std::to_string(script_timeout_s) + " s"
                                        : " exited " + std::to_string(r.exit_code))
                        << "\n--- summary ---\n"
                        << (summary.empty() ? "(no SDK-CHECK line)" : summary)
                        << "\n--- client stderr ---\n"
                        << tail(r.err) << "\n--- server ---\n"
                        << tail(serve.output());
    if (passed)
      std::cout << summary << std::endl; // the measured numbers
    EXPECT_EQ(serve.stop(), 0) << serve.output();
  }

  fs::path dir_;
};

TEST_F(SdkClient, SupervisedLoopLowersTheLoss) {
  check("supervised.py");
}

TEST_F(SdkClient, RlLoopWithImportanceSamplingAndPpo) {
  check("rl_loop.py");
}

TEST_F(SdkClient, SaveStateAndLoadStateRoundTrip) {
  check("state_roundtrip.py");
}

// Issue 11, point 1.
TEST_F(SdkClient, ConcurrentSamplersSampleTheirOwnModel) {
  check("crosstalk.py");
}

// Issue 11, point 2.
TEST_F(SdkClient, EphemeralSamplersAreSnapshots) {
  check("snapshots.py");
}

// Issue 11, point 3.
TEST_F(SdkClient, SeedsGiveUnrelatedSampleStreams) {
  check("seeds.py");
}

// Issue 11, point 4.
TEST_F(SdkClient, TargetsNeedNotBeTheShiftedInputs) {
  check("targets.py");
}

// Issue 23: SDK 0.25's forward_backward_custom sends negative cross_entropy weights.
TEST_F(SdkClient, DpoThroughForwardBackwardCustomEqualsTheLossByHand) {
  check("dpo.py");
}

// Issue 23: prompt log-probs, their top-k and compute_logprobs as SDK 0.25 exposes them.
TEST_F(SdkClient, PromptLogprobsTopkAndComputeLogprobs) {
  check("prompt_logprobs.py");
}

// Issue 23: the RestClient methods the server does not support fail at once, naming why.
TEST_F(SdkClient, UnsupportedRestMethodsAreRefusedNamingThem) {
  check("rest_refusals.py");
}

// Issue 14: stop strings on the base model, a LoRA sampler and a sampler checkpoint.
TEST_F(SdkClient, StopStringsEndSequencesWhereTheirTextFirstHoldsOne) {
  check("stop_strings.py");
}

} // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1)
    rlforge_bin = argv[1];
  if (argc > 2)
    scripts_dir = argv[2];
  if (argc > 3)
    sdk_dir = argv[3];
  return RUN_ALL_TESTS();
}
