#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/rank_op.hpp"
#include "actors/worker.hpp"
#include "backends/algo/common.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// Per-row outputs (`[B, R]`, one row per input row, in input order) and metrics
/// (`name:reduction`) of a `forward` or `forward_backward`.
struct train_output {
  std::map<std::string, at::Tensor> outputs;
  std::map<std::string, double> metrics;
  /// The weight of the `:mean` metrics (batch_result::tokens), to combine several outputs.
  double tokens = 0;

  /// The metric `name`, or NaN when absent.
  double metric(const std::string& name) const;
};

/// Blocking driver API over the dispatcher (dispatcher.hpp): every call sends one request and
/// waits for its answer, bounded by the client's timeout (per rank inside the groups, plus a
/// little slack for routing). Errors are values naming the role, op and rank.
///
/// Thread-safety: a client may be used from one thread at a time (each call opens its own
/// scoped actor); several clients may share a dispatcher. Do not call from inside an actor.
class trainer_client {
public:
  /// `timeout` bounds every call (default 600 s, must be > 0).
  trainer_client(caf::actor_system& sys, caf::actor dispatcher,
                 std::chrono::milliseconds timeout = std::chrono::seconds(600));

  /// Registers `group` as the workers of `role`; returns its DP size.
  caf::expected<int32_t> register_group(const std::string& role, const actor_group& group);

  /// Builds every rank's model; returns the number of parameters.
  caf::expected<int64_t> init_model(const std::string& role, const model_spec& spec);

  /// Forward pass without gradients: `logprobs` and `entropy` (policy, ref) or `values`
  /// (critic) per response token.
  caf::expected<train_output> forward(const std::string& role,
                                      const backends::training_batch& batch);

  /// Forward pass without gradients that also computes `loss` as `forward_backward` would:
  /// adds `elementwise_loss` and the loss's metrics (as Tinker's `forward`, which the Tinker
  /// backend runs as the workers' `tinker_forward` on a checked request).
  caf::expected<train_output> forward(const std::string& role, batch_payload batch,
                                      const loss_request& loss);

  /// Forward + backward of `loss_fn` (gradients accumulate until `optim_step`).
  caf::expected<train_output> forward_backward(const std::string& role,
                                               const backends::training_batch& batch,
                                               const std::string& loss_fn,
                                               const backends::algo::loss_config& config = {});

  /// Same, with a batch already in wire form (no conversion on the caller's side).
  caf::expected<train_output> forward_backward(const std::string& role, batch_payload batch,
                                               const loss_request& loss);

  /// One optimizer step with `params` (gradients all-reduced over the DP ranks first); a
  /// negative learning rate uses the workers' schedule.
  caf::expected<optim_result> optim_step(const std::string& role,
                                         const backends::adam_params& params);

  caf::expected<void> set_lr(const std::string& role, double lr);

  caf::expected<void> set_algorithm_config(const std::string& role, const algorithm_config& config);

  /// Saves every rank of every role in `roles` under `root/global_step_N/<role>/`, then writes
  /// `trainer_state.json` (with `trainer_state`, an object) and `latest_global_step.txt` last.
  /// In a cluster each rank writes on the node it runs on: with a file system shared by every
  /// node all of it lands in one tree; with per-node directories (the same `root` path on each
  /// node) every node holds its ranks' directories and the driver's holds the commit files.
  caf::expected<void>
  save_checkpoint(const std::string& root, int64_t global_step,
                  const std::vector<std::string>& roles,
                  const nlohmann::json& trainer_state = nlohmann::json::object());

  /// Loads step `global_step` (negative: the latest committed one, from the driver's
  /// `latest_global_step.txt`) into every role of `roles`; returns the step loaded. First every
  /// rank checks that it sees its own directory (`checkpoint_visible`): a resume some rank cannot
  /// see is refused before anything loads, naming the path and the node. A checkpoint saved with
  /// another DP size is an error.
  caf::expected<int64_t> load_checkpoint(const std::string& root, int64_t global_step,
                                         const std::vector<std::string>& roles);

  /// Writes the role's model in Hugging Face layout (LoRA merged) to `dir`.
  caf::expected<void> save_hf_model(const std::string& role, const std::string& dir);

  /// Registers `engines` (a group of the `engine` kind) as the inference engines of `role`
  /// (default "engines"); returns the number of engines.
  caf::expected<int32_t> register_engines(const actor_group& engines,
                                          const std::string& role = "engines");

  /// Declares the roles that share devices (e.g. {"policy", "ref", "engines"}): the dispatcher
  /// then keeps only the role being called on the device. An empty list turns colocation off.
  caf::expected<void> colocate(const std::vector<std::string>& roles);

  /// Forces the weight transport of every sync ("auto", "in_process", "shm", "gloo").
  caf::expected<void> set_weight_transport(const std::string& transport);

  /// Turns delta weight syncs on or off (`dispatcher_delta_atom`): syncs through Gloo send only
  /// the elements that changed, when that is smaller; bit-identical to a full sync.
  caf::expected<void> set_weight_delta(bool on);

  /// Generates from the engines of `role`: requests spread over the engines (least loaded
  /// first), outputs in request order (`num_samples` consecutive rows per request).
  caf::expected<std::vector<sample_output>> generate(const std::vector<sample_request>& requests,
                                                     const std::string& role = "engines");

  /// Copies `role`'s weights (LoRA merged) to every live engine; returns the engines' new weight
  /// version. Engines that are not colocated pause around the transfer in `pause_mode`: "keep"
  /// (also when empty: requests in flight continue on the new weights) or "abort" (they are
  /// stopped and handed back to their consumers). The new version is at least `least_version`.
  caf::expected<int64_t> save_weights_for_sampler(const std::string& role = "policy",
                                                  const std::string& pause_mode = "",
                                                  int64_t least_version = 0);

  /// The dispatcher's view as JSON: roles, residency and the per-device memory ledger (see
  /// `dispatcher_status_atom`).
  caf::expected<nlohmann::json> status();

  /// The syncs completed so far (`dispatcher_syncs_atom`).
  caf::expected<sync_totals> syncs();

  /// LCM of the registered groups' DP sizes.
  caf::expected<int32_t> lcm_dp_size();

  /// `op` on `role` (as the op's kind declares it, or the dispatcher's own
  /// `dispatcher_ops::sync_weights`): the arguments are checked against the op's declared types
  /// when this compiles, and the answer is read as its declared type.
  template <class R, class... Declared, class... Given>
  caf::expected<R> call(const std::string& role, const op_ref<R(Declared...)>& op,
                        Given&&... args) {
    return op.answer(call(role, op.id, op.args(std::forward<Given>(args)...)));
  }

  /// Raw call: the op whose id is `op` with `args` on `role`; the answer of the dispatcher
  /// (for tests of bad calls).
  caf::expected<caf::message> call(const std::string& role, caf::atom_value op, caf::message args);

  const caf::actor& dispatcher() const { return dispatcher_; }

private:
  caf::actor_system* sys_;
  caf::actor dispatcher_;
  std::chrono::milliseconds timeout_;
};

} // namespace rlforge::actors
