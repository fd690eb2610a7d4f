#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/dispatcher_backend_options.hpp"
#include "actors/tinker_backend.hpp"

namespace rlforge::actors {

/// The Tinker backend (tinker_backend.hpp) over rlforge's actor runtime. It wires four pieces:
///  - the model registry (tinker_models.hpp): every model is an actor group of one rank (worker
///    kind `policy` or `critic`, worker.hpp) registered in one dispatcher (dispatcher.hpp) under a
///    role named after the model and initialised from `base_model_dir` with the model's LoRA
///    adapters (`train_attn`, `train_mlp` and `train_unembed` choose the adapted projections;
///    the unembedding adapter is on the lm_head). Several LoRA models share the frozen base
///    tensors of one process (worker.hpp); each has its own adapters and AdamW state. A critic
///    is the base model plus its own value head (and adapters when rank > 0);
///  - training (tinker_training.hpp): requests checked once against the loss catalog and the
///    model's limits, converted once into the trainer's batch (backends/train/tinker_batch.hpp),
///    and computed by the worker, which computes the loss for `forward` as for
///    `forward_backward`;
///  - sampling (tinker_sampling.hpp): the base engine, a private engine per model holding its
///    sampler snapshots (each sampler bound to the weights it was created from), and engines for
///    persisted sampler checkpoints;
///  - checkpoints (tinker_checkpoints.hpp).
///
/// Errors: `tinker::request_error` with the category the worker's error code implies
/// (`category_of`), naming the request, datum and value; a refused request leaves the model as
/// it was.
class dispatcher_backend : public tinker_backend {
public:
  /// `sys` must have the worker kinds and the engine kind registered (`register_worker_kinds`,
  /// `register_engine_kind`, before the system started) and outlive the backend. Reads the
  /// base model's config.json (vocabulary, context length); throws `tinker::request_error`
  /// (server) naming the directory when it cannot, or for bad options.
  dispatcher_backend(caf::actor_system& sys, dispatcher_backend_options options);

  /// Stops every group, engine and dispatcher the backend spawned.
  ~dispatcher_backend() override;

  dispatcher_backend(const dispatcher_backend&) = delete;
  dispatcher_backend& operator=(const dispatcher_backend&) = delete;

  void create_model(const std::string& model_id, const tinker::lora_config& lora,
                    tinker::model_role role) override;
  bool has_model(const std::string& model_id) override;
  void delete_model(const std::string& model_id) override;
  std::vector<tinker::forward_backward_output>
  forward_backward(const std::vector<tinker::forward_backward_request>& batch) override;
  std::map<std::string, double> optim_step(const std::string& model_id,
                                           const tinker::adam_params& p) override;
  int64_t save_sampler_snapshot(const std::string& model_id) override;
  void export_sampler_weights(const std::string& model_id,
                              const tinker::checkpoint_ref& where) override;
  std::vector<tinker::sample_response>
  sample(const std::vector<tinker::sample_request>& requests) override;
  void save_checkpoint(const std::string& model_id, const tinker::checkpoint_ref& where,
                       bool with_optimizer) override;
  void load_checkpoint(const std::string& model_id, const tinker::checkpoint_ref& where,
                       bool with_optimizer) override;
  std::string base_model_name() const override;
  std::optional<std::string> tokenizer_id() const override;
  int64_t max_context_length() const override;
  int64_t vocab_size() const override;
  backend_stats stats() override;

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
