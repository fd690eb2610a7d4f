#include "tests/cluster/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace rlforge::cluster_test {

child_process::child_process(std::vector<std::string> argv, std::string log_path,
                             std::map<std::string, std::string> env)
  : log_path_(std::move(log_path)) {
  pid_ = fork();
  if (pid_ < 0)
    throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
      _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    // The test process blocks no signals the child should see, but be explicit.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (const auto& [k, v] : env)
      setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
}

child_process::~child_process() {
  kill();
}

std::string child_process::log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool child_process::wait_for_log(const std::string& needle, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (log().find(needle) != std::string::npos)
      return true;
    if (!running() || std::chrono::steady_clock::now() > deadline)
      return log().find(needle) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void child_process::signal(int sig) {
  if (pid_ > 0 && !reaped_)
    ::kill(pid_, sig);
}

void child_process::reaped(int status) {
  reaped_ = true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::optional<int> child_process::wait_exit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0)
    return -1;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (reaped_)
      return exit_code_;
    auto r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped(status);
      return exit_code_;
    }
    if (r < 0) {
      reaped_ = true;
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline)
      return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void child_process::kill() {
  if (pid_ <= 0 || reaped_)
    return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped(status);
}

bool child_process::running() {
  if (pid_ <= 0 || reaped_)
    return false;
  int status = 0;
  auto r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped(status);
    return false;
  }
  if (r < 0) {
    reaped_ = true;
    return false;
  }
  return true;
}

std::string word_after(const std::string& text, const std::string& prefix) {
  auto at = text.find(prefix);
  if (at == std::string::npos)
    return {};
  auto start = at + prefix.size();
  auto end = text.find_first_of(" \t\r\n)", start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

} // namespace rlforge::cluster_test
