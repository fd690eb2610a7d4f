// The built-in task --task names (task_choice.hpp).
#include "examples/grpo/task_choice.hpp"

#include <stdexcept>

#include "examples/grpo/arith_task.hpp"
#include "examples/grpo/count_task.hpp"
#include "examples/grpo/sort_task.hpp"

namespace rlforge::examples::grpo {

std::unique_ptr<verifiable_task> make_task(const options& opt) {
  if (opt.task == "arith") {
    arith::task_config cfg;
    cfg.digits = opt.digits;
    cfg.held_out = opt.held_out;
    cfg.seed = opt.seed;
    return std::make_unique<arith::task>(cfg);
  }
  if (opt.task == "sort") {
    sorting::task_config cfg;
    cfg.min_numbers = opt.min_numbers;
    cfg.max_numbers = opt.max_numbers;
    cfg.held_out = opt.held_out;
    cfg.seed = opt.seed;
    return std::make_unique<sorting::task>(cfg);
  }
  if (opt.task == "count") {
    counting::task_config cfg;
    cfg.min_numbers = opt.min_numbers;
    cfg.max_numbers = opt.max_numbers;
    cfg.held_out = opt.held_out;
    cfg.seed = opt.seed;
    return std::make_unique<counting::task>(cfg);
  }
  throw std::invalid_argument("--task must be arith, sort or count, got '" + opt.task + "'");
}

} // namespace rlforge::examples::grpo
