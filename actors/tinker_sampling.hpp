#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/tinker_backend.hpp"
#include "actors/tinker_groups.hpp"
#include "actors/tinker_healing.hpp"
#include "actors/tinker_models.hpp"
#include "tinker/datum_check.hpp"
#include "tinker/types.hpp"

namespace rlforge::actors {

/// The inference engines of the Tinker backend (dispatcher_backend.hpp) and sampling on them.
///
/// Three kinds of samplers (`tinker::sampler_ref`):
///  - the base model: one engine loaded from the base directory, spawned on first use;
///  - snapshots: every model that saved sampler weights has an engine of its own behind a
///    dispatcher private to the model (its group as role "trainer", the engine as "engines", so
///    no other model's engine is touched by its syncs). `save_snapshot` syncs the model's current
///    weights (LoRA merged) as a new weight version and has the engine retain it; a snapshot
///    sampler names (model, version) and samples exactly those weights for as long as the engine
///    retains them, whatever the model trained or saved since (the `max_sampler_snapshots` most
///    recently used versions per model; an evicted one is refused with a message saying so);
///  - persisted checkpoints: an engine loaded from the export directory, cached (the
///    `max_export_engines` most recently used ones; a dropped one is reloaded on demand).
///
/// Every engine is given the base model's tokenizer (`model_spec::tokenizer_dir`) when the base
/// directory has one, for stop strings.
///
/// Healing (tinker_healing.hpp): an engine spawned under an older placement generation is on a
/// lost placement. The base and export engines are loaded again on their next use; a model's
/// engine is spawned again when the model is rebuilt, which saves again the snapshots its journal
/// holds, at their versions. Snapshots older than the journal are lost: sampling them is refused
/// (not_found) naming the lost node. A sample call whose engine is lost heals and is retried once.
///
/// Thread-safety: every method may be called from any thread. `sample` never takes a model's
/// training lock, so sampling a snapshot runs concurrently with the model's training; a sync that
/// arrives while a snapshot is being sampled pauses the engine, and the paused calls run after it
/// on the versions they name.
class tinker_sampling {
public:
  /// `base_name` names the base model in messages. Whether the base directory holds a tokenizer
  /// is looked up once, here. `refresh_model(id)` brings model `id` to the current placement
  /// generation (rebuilding it when it is older), taking the model's training lock; it is called
  /// with no lock of this class held.
  tinker_sampling(tinker_groups& groups, tinker_healing& healing, tinker::model_limits limits,
                  std::string base_name, std::function<void(const std::string&)> refresh_model);

  /// Stops every engine and dispatcher (no wait).
  ~tinker_sampling();

  tinker_sampling(const tinker_sampling&) = delete;
  tinker_sampling& operator=(const tinker_sampling&) = delete;

  /// Syncs the current weights of policy `m` (locked by the caller) to its engine (spawned on
  /// first use) and returns the new snapshot version (≥ 1, increasing per model). A rebuild
  /// replaying the journal passes the version the entry saved as `replayed_version`, and gets
  /// that same version back.
  int64_t save_snapshot(tinker_model& m, int64_t replayed_version = 0);

  /// Stops the engine of `model_id` and waits for it (the model is being deleted); its snapshots
  /// are gone: sampling them is refused as "deleted".
  void drop_model(const std::string& model_id);

  /// Samples every request on the weights its `sampler` names (see `tinker::sample_request`).
  /// Requests are checked first (`tinker::check_sample`; stop strings are refused when the base
  /// model has no tokenizer). One response per request, in order; `num_samples` sequences each,
  /// sample j of a seeded request drawing from the stream of (seed, first_sample + j). Stop
  /// strings are matched in the engines on the decoded text of each sequence
  /// (backends/model/stop_strings.hpp): the sequence ends with the token that completed one,
  /// stop_reason "stop". Every sampler decodes with the base model's tokenizer (exports and
  /// snapshots have the base model's vocabulary). Throws
  /// `tinker::request_error`: user for bad input, not_found for a sampler whose model was
  /// deleted, whose snapshot was evicted or whose checkpoint is gone, server otherwise. Messages
  /// name the sampler by `sampler_ref::name`, never by a server path.
  std::vector<tinker::sample_response> sample(const std::vector<tinker::sample_request>& requests);

  /// What every engine alive now holds in its KV cache (asked now, `timeout` each; an engine that
  /// does not answer in time is left out), and the snapshot syncs done so far.
  backend_stats stats(std::chrono::milliseconds timeout);

private:
  /// An engine behind its own dispatcher; stopped when the last user lets go.
  struct engine {
    actor_group group;
    caf::actor dispatcher;
    uint64_t last_used = 0;
    uint64_t generation = 0; ///< the placement generation `group` was spawned under
    ~engine();
  };
  /// A model's engine and what it knows about its snapshots.
  struct model_engine {
    std::mutex mutex; ///< guards the fields below
    std::shared_ptr<engine> e;
    caf::actor trainer;        ///< the model group registered in `e`'s dispatcher
    int64_t version = 0;       ///< the latest snapshot version (0: none yet)
    std::set<int64_t> evicted; ///< versions the engine no longer retains
    std::set<int64_t> lost;    ///< versions lost with a node and not saved again
    std::string lost_node;     ///< the node they were lost with
    sync_totals synced;        ///< the engine's dispatcher's totals when last read
  };

  std::shared_ptr<engine> base_engine();
  std::shared_ptr<engine> export_engine(const tinker::sampler_ref& ref);
  std::shared_ptr<engine> snapshot_engine(const tinker::sampler_ref& ref);
  std::shared_ptr<engine> engine_for(const tinker::sampler_ref& ref);
  std::shared_ptr<engine> make_engine(const std::string& dir, const std::string& what,
                                      bool untie = false);
  /// True when `e` was spawned under an older placement generation than the current one.
  bool stale(const engine& e) const;
  /// Drops `me`'s engine when it is stale, marking the versions it retained lost (`me.mutex`
  /// held by the caller).
  void drop_if_stale(model_engine& me);

  tinker_groups& groups_;
  tinker_healing& healing_;
  std::function<void(const std::string&)> refresh_model_;
  tinker::model_limits limits_;
  std::string base_name_;
  bool base_has_tokenizer_ = false;

  std::mutex mutex_; ///< guards the maps below
  std::shared_ptr<engine> base_;
  std::map<std::string, std::shared_ptr<model_engine>> models_;
  std::set<std::string> deleted_;
  std::map<std::string, std::shared_ptr<engine>> exports_; ///< by export directory
  uint64_t clock_ = 0;
  sync_totals syncs_; ///< every snapshot sync of every model, deleted ones too
};

} // namespace rlforge::actors
