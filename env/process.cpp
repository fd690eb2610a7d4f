#include "env/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace rlforge::env {

namespace {

using clock = std::chrono::steady_clock;

int remaining_ms(clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  if (left <= 0)
    return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left);
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

std::string errno_text(int err) {
  return std::strerror(err);
}

/// Writes with SIGPIPE blocked in this thread, so a child that closed its stdin gives EPIPE
/// rather than a process-wide signal; a SIGPIPE raised meanwhile is consumed.
ssize_t write_no_sigpipe(int fd, const char* data, std::size_t size) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const ssize_t n = ::write(fd, data, size);
  const int saved = errno;
  if (n < 0 && saved == EPIPE) {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return n;
}

} // namespace

child_process::child_process(const process_spec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty())
    throw env_error(failure::spawn, "no program to run (empty command)");
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]})
      if (fd >= 0)
        ::close(fd);
  };
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    close_all();
    throw env_error(failure::spawn, "cannot create pipes: " + errno_text(e));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  if (!spec.working_directory.empty())
    posix_spawn_file_actions_addchdir_np(&actions, spec.working_directory.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t no_signals, all_signals;
  sigemptyset(&no_signals);
  sigfillset(&all_signals);
  posix_spawnattr_setsigmask(&attr, &no_signals);
  posix_spawnattr_setsigdefault(&attr, &all_signals);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::map<std::string, std::string> vars;
  if (spec.inherit_environment) {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const auto eq = entry.find('=');
      if (eq != std::string::npos)
        vars[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
  }
  for (const auto& [k, v] : spec.environment)
    vars[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars)
    env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  const bool search_path = spec.argv[0].find('/') == std::string::npos;
  pid_t pid = -1;
  const int rc = search_path
                     ? ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data())
                     : ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    std::string where;
    if (!spec.working_directory.empty())
      where = " in '" + spec.working_directory + "'";
    throw env_error(failure::spawn,
                    "cannot start '" + spec.argv[0] + "'" + where + ": " + errno_text(rc));
  }
  pid_ = pid;
  stdin_ = in[1];
  stdout_ = out[0];
  stderr_ = err[0];
  set_nonblocking(stdin_);
  set_nonblocking(stdout_);
  set_nonblocking(stderr_);
}

child_process::~child_process() {
  terminate(std::chrono::milliseconds(0));
}

void child_process::drain_stderr() {
  if (stderr_ < 0)
    return;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(stderr_, buf, sizeof buf);
    if (n > 0) {
      err_tail_.append(buf, static_cast<std::size_t>(n));
      if (err_tail_.size() > stderr_tail_bytes)
        err_tail_.erase(0, err_tail_.size() - stderr_tail_bytes);
      continue;
    }
    if (n == 0) {
      ::close(stderr_);
      stderr_ = -1;
    }
    return;
  }
}

std::string child_process::stderr_tail() {
  drain_stderr();
  return err_tail_;
}

void child_process::write_line(const std::string& line, clock::time_point deadline) {
  if (stdin_ < 0)
    throw env_error(failure::crashed, "the process's stdin is closed");
  const std::string data = line + "\n";
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = write_no_sigpipe(stdin_, data.data() + sent, data.size() - sent);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EPIPE)
      throw env_error(failure::crashed, "the process closed its stdin (it exited or stopped "
                                        "reading)");
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      throw env_error(failure::crashed, "writing to the process failed: " + errno_text(errno));
    // Wait for room, draining stderr meanwhile so a chatty child cannot block us both.
    pollfd fds[2] = {{stdin_, POLLOUT, 0}, {stderr_, POLLIN, 0}};
    const int wait = remaining_ms(deadline);
    if (wait == 0)
      throw env_error(failure::timeout, "the process did not read its input in time");
    if (::poll(fds, stderr_ >= 0 ? 2 : 1, wait) > 0 && stderr_ >= 0 && fds[1].revents != 0)
      drain_stderr();
  }
}

std::optional<std::string> child_process::read_line(clock::time_point deadline,
                                                    std::size_t max_bytes) {
  std::size_t scanned = 0;
  while (true) {
    const std::size_t nl = out_buffer_.find('\n', scanned);
    if (nl != std::string::npos) {
      if (nl > max_bytes)
        throw env_error(failure::protocol, "a line of " + std::to_string(nl) +
                                               " bytes exceeds the limit of " +
                                               std::to_string(max_bytes) + " bytes");
      std::string line = out_buffer_.substr(0, nl);
      out_buffer_.erase(0, nl + 1);
      return line;
    }
    scanned = out_buffer_.size();
    if (out_buffer_.size() > max_bytes)
      throw env_error(failure::protocol,
                      "a line exceeds the limit of " + std::to_string(max_bytes) + " bytes");
    if (stdout_ < 0)
      return std::nullopt;
    pollfd fds[2] = {{stdout_, POLLIN, 0}, {stderr_, POLLIN, 0}};
    const int wait = remaining_ms(deadline);
    if (wait == 0)
      throw env_error(failure::timeout, "no reply in time");
    const int ready = ::poll(fds, stderr_ >= 0 ? 2 : 1, wait);
    if (ready < 0 && errno != EINTR)
      throw env_error(failure::crashed, "poll failed: " + errno_text(errno));
    if (ready <= 0)
      continue;
    if (stderr_ >= 0 && fds[1].revents != 0)
      drain_stderr();
    if (fds[0].revents != 0) {
      char buf[65536];
      while (true) {
        const ssize_t n = ::read(stdout_, buf, sizeof buf);
        if (n > 0) {
          out_buffer_.append(buf, static_cast<std::size_t>(n));
          if (out_buffer_.size() > max_bytes + 1)
            break;
          continue;
        }
        if (n == 0) {
          ::close(stdout_);
          stdout_ = -1;
        }
        break;
      }
    }
  }
}

std::string child_process::terminate(std::chrono::milliseconds grace) {
  if (pid_ <= 0)
    return ended_;
  if (stdin_ >= 0) {
    ::close(stdin_);
    stdin_ = -1;
  }
  // Wait for the leader to exit on its own without reaping it: while it is an unreaped zombie
  // its pid (our process group id) cannot be reused, so killing the group below is safe.
  const auto deadline = clock::now() + grace;
  while (true) {
    siginfo_t info{};
    info.si_pid = 0;
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_)
      break;
    if (clock::now() >= deadline)
      break;
    drain_stderr();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(-pid_, SIGKILL); // the child and everything it started
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status))
    ended_ = "exit code " + std::to_string(WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    ended_ = "killed by signal " + std::to_string(WTERMSIG(status));
  else
    ended_ = "ended";
  pid_ = -1;
  drain_stderr();
  close_fds();
  return ended_;
}

void child_process::close_fds() {
  for (int* fd : {&stdin_, &stdout_, &stderr_}) {
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  }
}

} // namespace rlforge::env
