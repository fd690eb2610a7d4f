#include "env/error.hpp"

namespace rlforge::env {

const char* to_string(failure x) noexcept {
  switch (x) {
  case failure::spawn:
    return "spawn";
  case failure::handshake:
    return "handshake";
  case failure::timeout:
    return "timeout";
  case failure::crashed:
    return "crashed";
  case failure::protocol:
    return "protocol";
  case failure::environment:
    return "environment";
  case failure::usage:
    return "usage";
  }
  return "crashed";
}

namespace {

std::string compose(failure kind, const std::string& detail, const std::string& tail) {
  std::string out = std::string("environment ") + to_string(kind) + ": " + detail;
  if (!tail.empty())
    out += "\n--- stderr (last lines) ---\n" + tail;
  return out;
}

} // namespace

env_error::env_error(failure kind, const std::string& detail, std::string stderr_tail)
    : std::runtime_error(compose(kind, detail, stderr_tail)), kind_(kind), detail_(detail),
      stderr_tail_(std::move(stderr_tail)) {}

} // namespace rlforge::env
