#include "env/in_process_environment.hpp"

namespace rlforge::env {

reset_result in_process_environment::reset(const reset_request& request) {
  if (closed_)
    throw env_error(failure::usage, "reset after close");
  running_ = false;
  turns_ = 0;
  reset_result r = on_reset(request);
  running_ = true;
  return r;
}

step_result in_process_environment::step(const std::string& action) {
  if (closed_)
    throw env_error(failure::usage, "step after close");
  if (!running_)
    throw env_error(failure::usage, "step without a running episode (call reset first, or the "
                                    "episode is already done)");
  step_result r = on_step(action);
  ++turns_;
  if (max_turns_ > 0 && turns_ >= max_turns_)
    r.done = true;
  if (r.done)
    running_ = false;
  return r;
}

} // namespace rlforge::env
