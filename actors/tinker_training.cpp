#include "actors/tinker_training.hpp"

#include <utility>

#include "actors/worker.hpp"
#include "backends/train/optimizer.hpp"
#include "tinker/error.hpp"

namespace rlforge::actors {

std::vector<tinker::forward_backward_output>
tinker_forward_backward(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                        const tinker::model_limits& limits,
                        const std::vector<tinker::forward_backward_request>& batch) {
  if (batch.empty())
    tinker::fail_user("forward_backward: empty batch of requests");
  const bool forward_only = batch.front().forward_only;
  const auto& op = forward_only ? worker_ops::tinker_forward : worker_ops::tinker_forward_backward;
  const char* name = forward_only ? "forward" : "forward_backward";
  // Everything is checked before the first call, so a refused batch changes no gradient.
  std::vector<tinker::checked_request> checked;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& r = batch[i];
    auto where = std::string{name} + "(" + m.id + ") request " + std::to_string(i) + " (seq_id " +
                 std::to_string(r.seq_id) + ")";
    if (r.model_id != m.id)
      tinker::fail_user(where + " is for model '" + r.model_id + "' (one model per batch)");
    if (r.forward_only != forward_only)
      tinker::fail_user(where + " mixes forward and forward_backward in one batch");
    checked.push_back(tinker::check_request(r, m.role, limits, where));
  }
  auto c = groups.client(dispatcher);
  std::vector<tinker::forward_backward_output> outputs;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto context = std::string{name} + "(" + m.id + ", " + batch[i].loss_fn + ")";
    auto result = value_of(c.call(m.id, op, std::move(checked[i])), context);
    tinker::forward_backward_output out;
    out.loss_fn_outputs = std::move(result.datum_outputs);
    out.metrics = std::move(result.metrics);
    outputs.push_back(std::move(out));
  }
  return outputs;
}

std::map<std::string, double> tinker_optim_step(tinker_groups& groups, const caf::actor& dispatcher,
                                                tinker_model& m, const tinker::adam_params& a) {
  auto context = "optim_step(" + m.id + ")";
  try {
    backends::validate(a);
  } catch (const std::exception& e) {
    tinker::fail_user(context + ": " + e.what());
  }
  auto r = value_of(groups.client(dispatcher).optim_step(m.id, a), context);
  return {{"grad_norm:mean", r.grad_norm},
          {"learning_rate:mean", r.learning_rate},
          {"skipped:max", r.skipped ? 1.0 : 0.0},
          {"clipped:max", r.clipped ? 1.0 : 0.0},
          {"step:max", static_cast<double>(r.step)}};
}

} // namespace rlforge::actors
