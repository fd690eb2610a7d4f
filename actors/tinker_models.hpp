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

/// One trainable model. `mutex` serialises the model's training calls (forward_backward,
/// optim_step, checkpoints, sampler saves); `ready` is true from a successful creation until the
/// deletion began. The identity fields never change after creation.
struct tinker_model {
  std::string id;
  tinker::model_role role = tinker::model_role::policy;
  tinker::lora_config lora;
  std::mutex mutex;
  bool ready = false;
  actor_group group;
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
  void tear_down(tinker_model& m);

  tinker_groups& groups_;
  caf::actor dispatcher_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<tinker_model>> models_;
};

} // namespace rlforge::actors
