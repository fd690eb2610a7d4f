#pragma once
// A `rlforge serve` child process for the CLI tests (tests/cli): started on port 0 with its
// base model, database and checkpoints under one directory, its port read from the banner on
// stderr, stderr drained on a thread (kept for `output()`), SIGTERM on `stop()`, SIGKILL from the
// destructor and when the test process dies (PR_SET_PDEATHSIG).
//
// Thread-safety: `output()` may be called while the drain thread runs; the rest from one thread.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace rlforge::cli_test {

class serve_process {
public:
  /// Runs `rlforge_bin serve` on `dir`/base with RLFORGE_API_KEY `key`; waits up to 120 s for
  /// the banner (port() stays 0 when it never came).
  serve_process(const std::string& rlforge_bin, const std::filesystem::path& dir,
                const std::string& key) {
    int fds[2];
    if (pipe(fds) != 0)
      throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      setenv("RLFORGE_API_KEY", key.c_str(), 1);
      setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
      std::string base = (dir / "base").string(), db = (dir / "serve.db").string(),
                  ck = (dir / "checkpoints").string();
      execl(rlforge_bin.c_str(), rlforge_bin.c_str(), "serve", "--base-model", base.c_str(),
            "--port", "0", "--db", db.c_str(), "--checkpoint-dir", ck.c_str(), nullptr);
      _exit(127);
    }
    close(fds[1]);
    err_ = fds[0];
    // "rlforge serve: <model> on http://127.0.0.1:<port>/api/v1/ ..."
    std::string text;
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = read(err_, buf, sizeof(buf));
      if (n <= 0)
        break;
      text.append(buf, static_cast<size_t>(n));
      auto at = text.find("http://127.0.0.1:");
      if (at != std::string::npos && text.find('/', at + 17) != std::string::npos) {
        port_ = std::atoi(text.c_str() + at + 17);
        break;
      }
    }
    output_ = text;
    // Keep draining stderr so the server never blocks on a full pipe.
    drain_ = std::thread([this] {
      char b[4096];
      ssize_t n;
      while ((n = read(err_, b, sizeof(b))) > 0) {
        std::lock_guard<std::mutex> guard(mutex_);
        output_.append(b, static_cast<size_t>(n));
      }
    });
  }
  serve_process(const serve_process&) = delete;
  serve_process& operator=(const serve_process&) = delete;
  ~serve_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (drain_.joinable())
      drain_.join(); // the child is gone: read() returns 0
    if (err_ >= 0)
      close(err_);
  }
  int port() const { return port_; }
  std::string output() {
    std::lock_guard<std::mutex> guard(mutex_);
    return output_;
  }

  /// SIGTERM, then the exit status (-1 when it did not exit normally within 60 s; the
  /// destructor then kills it).
  int stop() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 600; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }

private:
  pid_t pid_ = -1;
  int err_ = -1;
  int port_ = 0;
  std::mutex mutex_;
  std::string output_;
  std::thread drain_;
};

} // namespace rlforge::cli_test
