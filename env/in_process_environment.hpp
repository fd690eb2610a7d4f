#pragma once

#include <string>

#include "env/environment.hpp"

/// A base for environments written in C++ that run in the driver's process. It keeps the
/// episode bookkeeping every environment needs — a step only after a reset, none after the
/// episode is done or the environment closed, an optional turn limit that ends the episode —
/// and hands the game itself to `on_reset` / `on_step`.
///
/// ```cpp
/// class echo : public env::in_process_environment {
///   env::reset_result on_reset(const env::reset_request&) override { return {"say hi", {}}; }
///   env::step_result on_step(const std::string& a) override { return {a, 1.0, true, {}}; }
/// };
/// ```
///
/// Thread safety: as `environment` (one caller at a time).
namespace rlforge::env {

class in_process_environment : public environment {
public:
  /// `max_turns` > 0 ends an episode after that many steps (the last result has done = true);
  /// 0 leaves it to the game.
  explicit in_process_environment(int max_turns = 0) : max_turns_(max_turns) {}

  reset_result reset(const reset_request& request) final;
  step_result step(const std::string& action) final;
  void close() final { closed_ = true; }
  bool usable() const final { return !closed_; }

  /// Steps taken in the running episode.
  int turns() const noexcept { return turns_; }

protected:
  virtual reset_result on_reset(const reset_request& request) = 0;
  virtual step_result on_step(const std::string& action) = 0;

private:
  int max_turns_;
  int turns_ = 0;
  bool running_ = false;
  bool closed_ = false;
};

} // namespace rlforge::env
