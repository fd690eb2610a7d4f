// The mean accuracy of a verifiable task's answers (verifiable_task.hpp).
#include "examples/grpo/verifiable_task.hpp"

#include <stdexcept>

namespace rlforge::examples::grpo {

double mean_accuracy(const verifiable_task& task,
                     const std::vector<std::vector<int64_t>>& prompts,
                     const std::vector<std::vector<int64_t>>& responses) {
  if (prompts.size() != responses.size())
    throw std::invalid_argument("mean_accuracy: " + std::to_string(prompts.size()) +
                                " prompts but " + std::to_string(responses.size()) +
                                " responses");
  if (prompts.empty())
    throw std::invalid_argument("mean_accuracy: no prompts");
  double sum = 0;
  for (size_t i = 0; i < prompts.size(); ++i)
    sum += task.accuracy(prompts[i], responses[i]);
  return sum / static_cast<double>(prompts.size());
}

} // namespace rlforge::examples::grpo
