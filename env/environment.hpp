#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "env/error.hpp"

/// The environment interface: a multi-turn text episode. `reset` starts an episode and returns
/// the first observation; each `step` takes the model's action text and returns the next
/// observation, a reward and whether the episode is over.
///
/// Implementations: `in_process_environment` (a base for C++ environments), `number_guess` (a
/// real one), `subprocess_environment` (any program speaking the JSON-lines protocol of
/// docs/ENVIRONMENTS.md). Failures throw `env_error`.
///
/// Thread safety: one environment is driven by one thread at a time; different environments are
/// independent (`environment_pool` runs many concurrently).
namespace rlforge::env {

/// What starts an episode: an optional seed and task data (any JSON object, e.g. a dataset row).
struct reset_request {
  std::optional<int64_t> seed;
  nlohmann::json task = nlohmann::json::object();
};

/// The first observation of an episode.
struct reset_result {
  std::string observation;
  nlohmann::json info = nlohmann::json::object();
};

/// The outcome of one action.
struct step_result {
  std::string observation;
  double reward = 0;
  bool done = false;
  nlohmann::json info = nlohmann::json::object();
};

class environment {
public:
  virtual ~environment() = default;

  /// Starts a new episode (abandoning any running one).
  virtual reset_result reset(const reset_request& request) = 0;

  /// Applies `action` to the running episode. Throws env_error (usage) without a running
  /// episode or after it is done.
  virtual step_result step(const std::string& action) = 0;

  /// Releases the environment's resources; later calls throw env_error (usage). Idempotent.
  virtual void close() = 0;

  /// False once the environment can take no more calls (closed, or its process failed); a
  /// pool replaces such an environment.
  virtual bool usable() const = 0;
};

} // namespace rlforge::env
