#pragma once

#include <cstdint>
#include <string>

#include "env/in_process_environment.hpp"

/// A multi-turn guessing game with a text reward, in C++ — the same game, with the same rules,
/// texts and secret numbers, as examples/envs/guess_number.py, so one can stand in for the
/// other in tests.
///
/// The secret is an integer in [1, 100]: `task.secret` when given, else derived from the seed
/// (`secret_for_seed`; seed 0 when none). Each action is read for its last integer; the reply
/// says "higher" / "lower" / "correct", or that no number was found. Reward: 1.0 on the turn the
/// secret is named, 0 otherwise. The episode ends on success or after `task.max_turns` steps
/// (default 5).
///
/// Thread safety: as `environment`.
namespace rlforge::env {

class number_guess : public in_process_environment {
public:
  number_guess() = default;

  /// The secret for `seed`: splitmix64(seed) mod 100 + 1.
  static int secret_for_seed(int64_t seed);

  /// The last integer written in `text` (an optional '-' then digits), if any.
  static bool last_integer(const std::string& text, int64_t& out);

protected:
  reset_result on_reset(const reset_request& request) override;
  step_result on_step(const std::string& action) override;

private:
  int secret_ = 0;
  int max_turns_ = 5;
  int turn_ = 0;
};

} // namespace rlforge::env
