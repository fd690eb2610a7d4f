#pragma once
// The GRPO job's training settings from its options (--kl-coef, --micro-batch-tokens,
// --temperature, --lr): what the policy and the reference model are configured with, and the
// learning-rate schedule. Plain C++ over the runtime's message types; no torch. Reentrant.
#include "examples/grpo/options.hpp"
#include "runtime/messages.hpp"

namespace rlforge::examples::grpo {

/// The training settings of the policy and the reference model: the KL loss (--kl-coef),
/// padding-free micro-batches of at most --micro-batch-tokens tokens (0 = one padded pass), and
/// log-probs at the sampling temperature (--temperature), the distribution the engines sampled
/// from and report log-probs of. So the policy gradient is that of the sampling policy, and the
/// off-policy correction's ratio compares log-probs of the same distribution (a trainer at
/// temperature 1 against engines at 0.7 would weight every sampled token by the temperature's
/// distortion, not by the policy's change).
algorithm_config training_config(const options& opt);

/// The policy's learning rate at `step` (1-based): cosine decay from --lr to a tenth of it.
double learning_rate(const options& opt, int step);

} // namespace rlforge::examples::grpo
