// The built-in task --task names (task_choice.hpp).
#include "examples/grpo/task_choice.hpp"

#include <stdexcept>

#include "examples/grpo/arith_task.hpp"
#include "examples/grpo/count_task.hpp"
#include "examples/grpo/sort_task.hpp"

namespace rlforge::examples::grpo {

namespace {

/// The configuration of a number-list task (sort, count) from the job's options.
template <class Config> Config number_task_config(const options& opt) {
  Config cfg;
  cfg.min_numbers = opt.min_numbers;
  cfg.max_numbers = opt.max_numbers;
  cfg.held_out = opt.held_out;
  cfg.seed = opt.seed;
  return cfg;
}

} // namespace

std::unique_ptr<verifiable_task> make_task(const options& opt) {
  if (opt.task == "arith") {
    arith::task_config cfg;
    cfg.digits = opt.digits;
    cfg.held_out = opt.held_out;
    cfg.seed = opt.seed;
    return std::make_unique<arith::task>(cfg);
  }
  if (opt.task == "sort")
    return std::make_unique<sorting::task>(number_task_config<sorting::task_config>(opt));
  if (opt.task == "count")
    return std::make_unique<counting::task>(number_task_config<counting::task_config>(opt));
  throw std::invalid_argument("--task must be arith, sort or count, got '" + opt.task + "'");
}

} // namespace rlforge::examples::grpo
