#pragma once

// A worker rank's state (policy, critic, ref) and the helpers its source files share. Internal:
// the workers' interface is actors/worker.hpp. A worker kind lives in three files:
//  - worker.cpp: the model and the ops around it (init_model, optim_step, set_lr,
//    set_algorithm_config), the kinds' registration, model building;
//  - worker_passes.cpp: the passes over a batch (forward, forward_backward on the RL API's
//    batches; tinker_forward, tinker_forward_backward on checked Tinker requests);
//  - worker_residency.cpp: checkpoints (save, load, save_hf_model) and residency (offload, onload,
//    memory).
//
// Ownership: `worker_state` belongs to its rank (rank_context::as). Thread-safety: everything
// here runs on the rank's thread, one op at a time.

#include <c10/core/GradMode.h>
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/base_weights.hpp"
#include "actors/batch_wire.hpp"
#include "actors/rank_device.hpp"
#include "actors/weight_sync.hpp"
#include "backends/algo/kl.hpp"
#include "backends/algo/losses.hpp"
#include "backends/collective_group.hpp"
#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/storage_bytes.hpp"
#include "backends/train/checkpoint.hpp"
#include "backends/train/lr_schedule.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/rng_state.hpp"
#include "backends/train/micro_batches.hpp"
#include "backends/storage_copier.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors::worker_detail {

namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
using be::error_code;
namespace keys = be::batch_keys;
using be::storage_bytes;
using be::storage_copier;

inline const char* const tag_model = "model";
inline const char* const tag_optimizer = "optimizer";

/// One rank's model replica and training state.
struct worker_state final : kind_state {
  std::string role; ///< policy, critic or ref
  std::unique_ptr<be::causal_lm> model;
  be::adamw optimizer;
  std::optional<be::lr_schedule> schedule;
  algorithm_config algo;
  /// While the model is offloaded (its parameters hold no storage): host copies of every
  /// parameter and of every accumulated gradient, by parameter name, and the device to return to.
  bool model_offloaded = false;
  std::map<std::string, at::Tensor> host_params;
  std::map<std::string, at::Tensor> host_grads;
  at::Device model_device{at::kCPU};
  /// While the optimizer is offloaded (the live optimizer is empty): its state in host memory.
  bool optimizer_offloaded = false;
  be::adamw_state host_optimizer;
  at::Device optimizer_device{at::kCPU};
  /// With LoRA on an HF base: the handle on the process-wide frozen base weights the model
  /// shares (base_weights.hpp), dropped with the model.
  std::shared_ptr<const void> shared_base;
  /// Gloo channels to the engines, kept between weight syncs (rank 0 of a policy).
  weight_channels channels;
};

// -- worker.cpp --------------------------------------------------------------------------------

/// The moments of an optimizer state as (name, tensor) pairs, for `storage_bytes`.
std::vector<std::pair<std::string, at::Tensor>> moments_of(const be::adamw_state& s);

/// The tags an offload/onload call names: all of the kind's when empty. Throws before anything
/// moves for an unknown tag or `optimizer` on a ref worker.
std::vector<std::string> parse_tags(const worker_state& st, const std::vector<std::string>& tags,
                                    const char* op);

be::causal_lm& model_of(worker_state& st, const char* op);

/// The model, refusing `op` while it is offloaded (its parameters hold no storage then).
be::causal_lm& resident_model(worker_state& st, const char* op);

/// Refuses `op` while the optimizer state is offloaded.
void require_resident_optimizer(const worker_state& st, const char* op);

// -- worker_passes.cpp ------------------------------------------------------------------------

// The passes over a batch (worker.hpp): the RL API's, which check their batch once, and the
// Tinker backend's, which compute a request `tinker::check_request` checked.
caf::expected<batch_result> forward(rank_context& ctx, worker_state& st,
                                    const batch_payload& payload,
                                    const std::optional<loss_request>& req);
caf::expected<batch_result> forward_backward(rank_context& ctx, worker_state& st,
                                             const batch_payload& payload, const loss_request& req);
caf::expected<tinker_pass_result> tinker_forward(rank_context& ctx, worker_state& st,
                                                 const tinker::checked_request& req);
caf::expected<tinker_pass_result> tinker_forward_backward(rank_context& ctx, worker_state& st,
                                                          const tinker::checked_request& req);

// -- worker_residency.cpp ----------------------------------------------------------------------

// Each takes the rank's context, the worker's state and the op's arguments by type;
// worker.cpp declares them as the kind's ops (`typed_op`), whose signatures name the arguments.
// A checkpoint's role directory defaults to the worker's role; load_checkpoint restores the
// optimizer too unless `with_optimizer` is false.
caf::expected<no_values> save_checkpoint(rank_context& ctx, worker_state& st, const std::string& root,
                         const int64_t& global_step, const std::optional<std::string>& role);
caf::expected<int64_t> load_checkpoint(rank_context& ctx, worker_state& st, const std::string& root,
                         const int64_t& global_step, const std::optional<std::string>& role,
                         const std::optional<bool>& with_optimizer);
caf::expected<no_values> save_hf_model(rank_context& ctx, worker_state& st, const std::string& dir);
caf::expected<no_values> offload(rank_context& ctx, worker_state& st, const std::vector<std::string>& tags);
caf::expected<no_values> onload(rank_context& ctx, worker_state& st, const std::vector<std::string>& tags);
caf::expected<std::tuple<int64_t, int64_t>> memory(rank_context& ctx, worker_state& st);

} // namespace rlforge::actors::worker_detail
