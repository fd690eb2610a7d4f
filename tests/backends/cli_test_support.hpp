/// Helpers shared by the end-to-end tests of the `rlforge` binary (model_cli_test.cpp,
/// generate_cli_test.cpp): run the binary through the shell, inspect what it printed and check
/// that bad invocations are refused.
///
/// Header-only and free of libtorch and backends headers, so CLI test targets that do not link
/// the backends library can use it. The including target must define RLFORGE_CLI_PATH (the
/// binary's path) as a string literal.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#ifndef RLFORGE_CLI_PATH
#error "cli_test_support.hpp needs RLFORGE_CLI_PATH, the path of the rlforge binary"
#endif

namespace rlforge::backends::testing {

/// What one run of the binary did: its exit code (-1 when it did not exit normally or could not
/// be started), everything it wrote on stdout and everything it wrote on stderr.
struct run_result {
  int code = -1;
  std::string out, err;
};

/// Runs `rlforge <args>` through the shell (so `args` may hold quoted words), capturing stdout
/// and stderr. stderr goes through a per-process file under the system temp dir, removed after.
inline run_result run_cli(const std::string& args) {
  const auto err_path =
      std::filesystem::temp_directory_path() / ("rlforge_cli_err_" + std::to_string(::getpid()));
  const std::string cmd =
      std::string("'") + RLFORGE_CLI_PATH + "' " + args + " 2>'" + err_path.string() + "'";
  run_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
    r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_path);
  return r;
}

/// "5,17,3": ids as the binary's --tokens and --prompt-tokens take them.
inline std::string join_ids(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

/// The number of '\n' characters in `s`.
inline size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s)
    n += c == '\n' ? 1 : 0;
  return n;
}

/// One invocation the binary must refuse: its arguments, the exit code it must return and a
/// string its one line on stderr must contain.
struct bad_case {
  std::string args;
  int code;
  std::string needle;
};

/// Runs `rlforge <prefix><args>` for each case and expects it to print nothing on stdout,
/// exactly one line on stderr containing the case's needle, and to exit with the case's code.
/// `prefix` names a subcommand shared by all the cases (e.g. "generate "), or is empty.
inline void expect_rejected(const std::vector<bad_case>& cases, const std::string& prefix = "") {
  for (const auto& c : cases) {
    const std::string args = prefix + c.args;
    auto r = run_cli(args);
    EXPECT_EQ(r.code, c.code) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
    EXPECT_EQ(count_lines(r.err), 1u) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << args << "\n" << r.err;
  }
}

} // namespace rlforge::backends::testing
