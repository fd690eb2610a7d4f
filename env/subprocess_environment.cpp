#include "env/subprocess_environment.hpp"

#include "env/protocol.hpp"

namespace rlforge::env {

namespace {

using clock = std::chrono::steady_clock;

std::string command_line(const process_spec& spec) {
  std::string out;
  for (const auto& a : spec.argv)
    out += (out.empty() ? "" : " ") + a;
  return out;
}

} // namespace

subprocess_environment::subprocess_environment(subprocess_options options)
    : options_(std::move(options)) {
  process_ = std::make_unique<child_process>(options_.process);
  std::optional<std::string> line;
  try {
    line = process_->read_line(clock::now() + options_.handshake_timeout, options_.max_line_bytes);
  } catch (const env_error& e) {
    fail(e.kind() == failure::protocol ? failure::handshake : e.kind(),
         "waiting for the handshake of '" + command_line(options_.process) + "': " + e.detail());
  }
  if (!line)
    fail(failure::handshake,
         "'" + command_line(options_.process) + "' closed its stdout before the handshake");
  try {
    protocol::check_handshake(*line);
  } catch (const env_error& e) {
    fail(failure::handshake, "'" + command_line(options_.process) + "': " + e.detail());
  }
}

subprocess_environment::~subprocess_environment() {
  close();
}

void subprocess_environment::fail(failure kind, const std::string& detail) {
  failed_ = true;
  running_ = false;
  std::string how;
  std::string tail;
  if (process_) {
    // A process that broke the protocol or is dying gets a moment to finish writing to stderr
    // (its last words explain the failure); a hung one is killed at once.
    how = process_->terminate(std::chrono::milliseconds(kind == failure::timeout ? 0 : 200));
    tail = process_->stderr_tail();
  }
  std::string text = detail;
  if (kind == failure::timeout)
    text += "; the process group was killed";
  if (kind == failure::crashed && !how.empty())
    text += " (process " + how + ")";
  throw env_error(kind, text, tail);
}

nlohmann::json subprocess_environment::call(const std::string& method, const std::string& line) {
  const int64_t id = next_id_ - 1;
  const auto deadline = clock::now() + options_.call_timeout;
  const std::string what = "'" + method + "' (id " + std::to_string(id) + ")";
  try {
    process_->write_line(line, deadline);
  } catch (const env_error& e) {
    fail(e.kind(), "sending " + what + ": " + e.detail());
  }
  std::optional<std::string> reply;
  try {
    reply = process_->read_line(deadline, options_.max_line_bytes);
  } catch (const env_error& e) {
    if (e.kind() == failure::timeout)
      fail(failure::timeout, "no reply to " + what + " within " +
                                 std::to_string(options_.call_timeout.count()) + " ms");
    fail(e.kind(), "reading the reply to " + what + ": " + e.detail());
  }
  if (!reply)
    fail(failure::crashed, "the process closed its stdout instead of answering " + what);
  try {
    return protocol::decode_reply(*reply, id, method);
  } catch (const env_error& e) {
    if (e.kind() == failure::environment) {
      running_ = false; // the episode is over; the process may be reset
      throw;
    }
    fail(e.kind(), e.detail());
  }
}

reset_result subprocess_environment::reset(const reset_request& request) {
  if (!usable())
    throw env_error(failure::usage, "reset on an environment that is closed or failed");
  running_ = false;
  const std::string line = protocol::encode_reset(next_id_++, request);
  const auto result = call("reset", line);
  try {
    reset_result r = protocol::decode_reset_result(result);
    running_ = true;
    return r;
  } catch (const env_error& e) {
    fail(e.kind(), e.detail());
  }
}

step_result subprocess_environment::step(const std::string& action) {
  if (!usable())
    throw env_error(failure::usage, "step on an environment that is closed or failed");
  if (!running_)
    throw env_error(failure::usage, "step without a running episode (call reset first, or the "
                                    "episode is already done)");
  const std::string line = protocol::encode_step(next_id_++, action);
  const auto result = call("step", line);
  try {
    step_result r = protocol::decode_step_result(result);
    if (r.done)
      running_ = false;
    return r;
  } catch (const env_error& e) {
    fail(e.kind(), e.detail());
  }
}

void subprocess_environment::close() {
  if (!process_ || !process_->running())
    return;
  running_ = false;
  if (!failed_) {
    try {
      const int64_t id = next_id_++;
      const auto deadline = clock::now() + options_.close_timeout;
      process_->write_line(protocol::encode_close(id), deadline);
      process_->read_line(deadline, options_.max_line_bytes);
    } catch (const env_error&) {
      // A child that cannot say goodbye is killed below all the same.
    }
  }
  failed_ = true;
  process_->terminate(options_.close_timeout);
}

} // namespace rlforge::env
