#pragma once
// The built-in task --task names, configured from the job's options (plain C++).
#include <memory>

#include "examples/grpo/options.hpp"
#include "examples/grpo/verifiable_task.hpp"

namespace rlforge::examples::grpo {

/// The task `opt.task` names ("arith", "sort" or "count") with the job's seed, held-out count and
/// the task's own options (--digits; --min-numbers, --max-numbers for sort and count). Throws
/// std::invalid_argument naming the task and what is wrong (an unknown name, a configuration the
/// task refuses).
std::unique_ptr<verifiable_task> make_task(const options& opt);

} // namespace rlforge::examples::grpo
