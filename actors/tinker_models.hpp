#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "actors/actor_group.hpp"
#include "actors/tinker_groups.hpp"
#include "tinker/loss_catalog.hpp"
#include "tinker/types.hpp"

/// The trainable models of the Tinker backend (dispatcher_backend.hpp): one actor group of one
/// worker rank per model, registered in one shared dispatcher under a role named after the model.
namespace rlforge::actors {

/// One call that changed a model's state, kept so that a model whose rank was lost can be
/// rebuilt by replaying it (tinker_healing.hpp).
struct journal_entry {
  enum class kind { forward_backward, optim_step, load_checkpoint, sampler_snapshot };

  static journal_entry of_forward_backward(std::vector<tinker::forward_backward_request> batch);
  static journal_entry of_optim_step(const tinker::adam_params& adam);
  static journal_entry of_load_checkpoint(tinker::checkpoint_ref where, bool with_optimizer);
  static journal_entry of_sampler_snapshot(int64_t version);

  kind type = kind::forward_backward;
  std::vector<tinker::forward_backward_request> batch; ///< forward_backward
  tinker::adam_params adam;                            ///< optim_step
  tinker::checkpoint_ref where;                        ///< load_checkpoint
  bool with_optimizer = false;                         ///< load_checkpoint
  int64_t version = 0;                                 ///< sampler_snapshot: the version saved
};

/// What rebuilds a model: its last recovery checkpoint (weights and optimizer, written right
/// after an optimizer step) and the calls since. Kept only while healing is enabled.
struct model_journal {
  std::string checkpoint;             ///< "" = the model as created
  std::vector<journal_entry> entries; ///< in call order
  int64_t optim_steps = 0;            ///< optim_step entries since `checkpoint`
};

/// One trainable model. `mutex` serialises the model's training calls (forward_backward,
/// optim_step, checkpoints, sampler saves) and guards every mutable field; `ready` is true from a
/// successful creation until the deletion began. The identity fields never change after
/// creation.
struct tinker_model {
  std::string id;
  tinker::model_role role = tinker::model_role::policy;
  tinker::lora_config lora;
  std::mutex mutex;
  bool ready = false;
  actor_group group;
  /// The placement generation `group` was spawned under (tinker_groups::placement); `built` is
  /// false while a rebuild has not replayed the whole journal yet.
  uint64_t generation = 0;
  bool built = false;
  model_journal journal;
};

/// The registry of models. Thread-safe: every method may be called from any thread; a model's
/// own calls lock its `mutex` (`lock`).
class tinker_models {
public:
  /// `dispatcher` is where the models' groups are registered; `groups` spawns them.
  tinker_models(tinker_groups& groups, caf::actor dispatcher);

  /// Creates `model_id`: checks the request (a taken id, a LoRA rank < 0 or above the base
  /// model's `max_rank`, LoRA adapting nothing, a negative seed: user errors naming the value),
  /// spawns its group and builds the model from the base directory (failures there are the
  /// server's and leave nothing registered).
  void create(const std::string& model_id, const tinker::lora_config& lora, tinker::model_role role,
              int64_t max_rank);

  /// Replaces `m`'s group (locked by the caller; its rank was lost) by a fresh one under the
  /// current placement, built as `create` built it, with `built` false: the caller replays the
  /// journal. Throws `request_error` (server) when it cannot.
  void rebuild(tinker_model& m);

  /// The model, locked for one call, or `request_error` (not_found) naming `op` and the id.
  std::pair<std::shared_ptr<tinker_model>, std::unique_lock<std::mutex>>
  lock(const std::string& model_id, const char* op);

  /// True when `model_id` exists and is ready.
  bool has(const std::string& model_id);

  /// Unregisters the model, stops its group and waits for it (its memory and placement share are
  /// freed when this returns); `request_error` (not_found) for an unknown id. `before_stop` runs
  /// with the model locked and unregistered, before its group stops (the sampling side drops the
  /// model's engine there).
  void remove(const std::string& model_id, const std::function<void(tinker_model&)>& before_stop);

  /// Stops every model without waiting (shutdown).
  void stop_all();

  /// The rank actors of `model_id` (empty when unknown), for tests.
  std::vector<caf::actor> ranks(const std::string& model_id);

private:
  /// Spawns `m`'s group, registers it and builds the model from the base directory.
  void build(tinker_model& m, const std::string& context);
  void tear_down(tinker_model& m);

  tinker_groups& groups_;
  caf::actor dispatcher_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<tinker_model>> models_;
};

} // namespace rlforge::actors
