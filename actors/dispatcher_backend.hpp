#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/tinker_backend.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// How a `dispatcher_backend` places and builds its models.
struct dispatcher_backend_options {
  /// Hugging Face directory of the base model (config.json + safetensors) every model is
  /// created on; required.
  std::string base_model_dir;
  /// Name reported by `base_model_name()`; empty = the last component of `base_model_dir`.
  std::string base_model_name;
  /// Where every actor group goes: one rank on bundle 0 of this placed group. Empty (no
  /// bundles) = a one-bundle group on this process's node with one CPU and no GPU.
  placement_group_info placement;
  /// When set, each rank reserves `gpu_per_group` of its bundle through this manager and gives
  /// it back when the group stops (so deleting a model frees its share).
  caf::actor placement_manager;
  /// GPU share of each group's rank (0 = the whole bundle GPU, see `group_spec`).
  double gpu_per_group = 0;
  /// Torch threads of each rank (≥ 1).
  int32_t threads_per_rank = 1;
  /// LoRA `alpha` of the adapters (the update is scaled by alpha / rank).
  double lora_alpha = 32.0;
  /// Engines loaded from persisted sampler exports kept at once (≥ 1; the least recently used
  /// one is stopped beyond that).
  size_t max_export_engines = 4;
  /// Deadline of every call to the actor groups (> 0).
  std::chrono::milliseconds timeout = std::chrono::seconds(600);
};

/// The Tinker backend (tinker_backend.hpp) over rlforge's actor runtime.
///
/// Layout:
///  - every model is an actor group of one rank (worker kind `policy` or `critic`, see
///    worker.hpp) registered in one dispatcher (dispatcher.hpp) under a role named after the
///    model id and initialised from `base_model_dir` (`model_spec::hf_dir`) with the model's
///    LoRA rank. Several LoRA models share the frozen base tensors of one process (worker.hpp,
///    `build_model`); each has its own adapters and AdamW state.
///  - a critic is the base model plus its own value head (and LoRA adapters when rank > 0),
///    trained only with `ppo_critic` (Tinker `ppo` on a critic maps to it too).
///  - sampling runs on inference engines (engine.hpp). The base model's engine (one rank) is
///    spawned on the first sample from the base; a model gets an engine of its own (one rank)
///    on its first `save_sampler_checkpoint`: `persist=false` copies the model's merged weights
///    into it through the dispatcher's `save_weights_for_sampler` (a dispatcher private to that
///    model, holding the model's group and its engine, so no other model's engine changes) and
///    writes the marker file `sampler_weights.json`; `persist=true` writes the HF export
///    (config.json + model.safetensors, LoRA merged, and the marker) and reloads the model's
///    engine from that export. `sample(model_id)` samples from the model's engine (its last
///    sampler checkpoint), or from the base engine when the model has none yet (its weights
///    then equal the base's: fresh adapters add zero).
///  - `sample(dir)` with the directory of a sampler checkpoint (not a model id) samples exactly
///    that checkpoint: a persisted export from an engine loaded from it (spawned on first use,
///    up to `max_export_engines` cached, least recently used stopped first), a synced one from
///    its model's engine (the model's last sync).
///
/// Loss mapping (Tinker → backends/algo, `tinker_to_loss_config`): `ppo` → `regular` with
/// eps_clip_low = 1 - clip_low_threshold, eps_clip_high = clip_high_threshold - 1; `cispo`,
/// `gspo`, `dppo`, `dro`, `cross_entropy`, `importance_sampling`, `ppo_critic` as documented
/// there. Every config key is checked against the loss (an unknown key is refused).
///
/// forward_backward: requests are grouped by (loss_fn, loss_fn_config); each group is one
/// training batch (`from_datums`) and one call. Per datum the outputs are `logprobs` and
/// `elementwise_loss` (policy) or `values` and `elementwise_loss` (critic), float32 of the
/// datum's length. Metrics are those of the request's group, except `loss:sum`, which is the
/// request's own (the sum of its datums' elementwise losses). `forward` (forward_only)
/// computes the same loss without gradients. `tinker_lora_config::train_unembed` is accepted
/// but the unembedding is never adapted; `train_attn` / `train_mlp` select the projections.
///
/// Checkpoints: `save_checkpoint` writes the worker's full state (weights, AdamW moments,
/// schedule, RNG) under `dir/global_step_0/model/rank_0/` plus `dir/tinker_checkpoint.json`
/// (model kind, LoRA rank, whether the optimizer was requested). `load_checkpoint` with
/// `with_optimizer` restores everything (training resumes bit for bit); without it only the
/// weights are loaded and the optimizer starts fresh. A checkpoint of another kind or LoRA
/// rank is refused naming both.
///
/// Thread-safety: every method may be called from any thread; calls on different models run
/// concurrently, calls on one model are serialised. Errors: `tinker::request_error` with
/// category "user" (bad input, naming the request and datum), "not_found" (unknown model) or
/// "server" (a failure of the runtime); a refused request leaves the model as it was.
class dispatcher_backend : public tinker_backend {
public:
  /// `sys` must have the worker kinds and the engine kind registered (`register_worker_kinds`,
  /// `register_engine_kind`, before the system started) and outlive the backend. Reads the
  /// base model's config.json (vocabulary, context length); throws `tinker::request_error`
  /// ("server") naming the directory when it cannot, or for bad options.
  dispatcher_backend(caf::actor_system& sys, dispatcher_backend_options options);

  /// Stops every group, engine and dispatcher the backend spawned.
  ~dispatcher_backend() override;

  dispatcher_backend(const dispatcher_backend&) = delete;
  dispatcher_backend& operator=(const dispatcher_backend&) = delete;

  void create_model(const std::string& model_id, const tinker::lora_config& lora,
                    const std::string& role) override;
  bool has_model(const std::string& model_id) override;
  void delete_model(const std::string& model_id) override;
  std::vector<tinker::forward_backward_output>
  forward_backward(const std::vector<tinker::forward_backward_request>& batch) override;
  std::map<std::string, double> optim_step(const std::string& model_id,
                                           const tinker::adam_params& p) override;
  std::vector<tinker::sample_response>
  sample(const std::string& model_id, const std::vector<tinker::sample_request>& requests) override;
  void save_checkpoint(const std::string& model_id, const std::string& dir,
                       bool with_optimizer) override;
  void load_checkpoint(const std::string& model_id, const std::string& dir,
                       bool with_optimizer) override;
  void save_sampler_checkpoint(const std::string& model_id, const std::string& dir,
                               bool persist) override;
  std::string base_model_name() const override;
  int64_t max_context_length() const override;
  int64_t vocab_size() const override;

  /// The dispatcher every model is registered in (roles = model ids), for status and tests.
  const caf::actor& dispatcher() const;

  /// The rank actors of `model_id`'s group (empty when the model does not exist).
  std::vector<caf::actor> model_ranks(const std::string& model_id);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Factory for `rlforge serve`: a `dispatcher_backend` behind the interface.
std::unique_ptr<tinker_backend> make_dispatcher_backend(caf::actor_system& sys,
                                                        dispatcher_backend_options options);

} // namespace rlforge::actors
