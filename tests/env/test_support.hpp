#pragma once

// Shared by the tests/env suites: where the example and the scripted children are, the Python
// check, and the check that no process started by a test is left behind.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "env/subprocess_environment.hpp"

namespace rlforge::env::test {

inline const std::string python = "/usr/bin/python3";
inline const std::string examples_dir = RLFORGE_EXAMPLES_ENVS_DIR;
inline const std::string children_dir = RLFORGE_ENV_CHILDREN_DIR;

inline bool have_python() {
  return ::access(python.c_str(), X_OK) == 0;
}

#define RLFORGE_REQUIRE_PYTHON()                                                                   \
  do {                                                                                             \
    if (!::rlforge::env::test::have_python())                                                      \
      GTEST_SKIP() << "python3 is not installed at " << ::rlforge::env::test::python               \
                   << " (the environment processes of this test are Python scripts)";              \
  } while (false)

/// The ids of the live (not yet reaped) child processes of this test process.
inline std::vector<pid_t> live_children() {
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr)
    return out;
  const pid_t self = ::getpid();
  while (dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == self)
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  ::closedir(proc);
  return out;
}

/// True while a live process (not a zombie waiting for its parent) is in process group `pgid`.
/// (A killed grandchild is reparented and reaped by init, which may take its time.)
inline bool group_alive(pid_t pgid) {
  if (pgid <= 0)
    return false;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr)
    return false;
  bool alive = false;
  while (dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != 'Z' && state != 'X')
      alive = true;
  }
  ::closedir(proc);
  return alive;
}

/// True when no live process is left in `pgid` within `wait` (a SIGKILLed grandchild takes a
/// moment to die).
inline bool group_gone(pid_t pgid, std::chrono::milliseconds wait = std::chrono::seconds(3)) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (group_alive(pgid)) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// Base fixture: fails a test that leaves a child process (or a process group it saw) behind.
class env_test : public ::testing::Test {
protected:
  void TearDown() override {
    EXPECT_TRUE(live_children().empty()) << "a child process of the test is still there";
    for (pid_t g : groups_)
      EXPECT_TRUE(group_gone(g)) << "process group " << g << " still has processes";
  }
  /// Remembers `pgid` for the check above.
  void track(pid_t pgid) {
    if (pgid > 0)
      groups_.push_back(pgid);
  }

  std::vector<pid_t> groups_;
};

inline subprocess_options python_child(const std::string& script,
                                       std::initializer_list<std::string> args = {}) {
  subprocess_options o;
  o.process.argv = {python, script};
  o.process.argv.insert(o.process.argv.end(), args.begin(), args.end());
  o.process.environment["PYTHONDONTWRITEBYTECODE"] = "1"; // no __pycache__ in the source tree
  o.handshake_timeout = std::chrono::seconds(20);
  o.call_timeout = std::chrono::seconds(20);
  return o;
}

inline subprocess_options misbehaving(const std::string& mode) {
  return python_child(children_dir + "/misbehave.py", {mode});
}

inline subprocess_options guess_number() {
  return python_child(examples_dir + "/guess_number.py");
}

/// Runs `f`; expects an env_error of `kind` whose message holds every one of `parts`.
inline void expect_env_error(const std::function<void()>& f, failure kind,
                             std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no env_error (expected " << to_string(kind) << ")";
  } catch (const env_error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
  }
}

} // namespace rlforge::env::test
