#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tinker/loss_catalog.hpp"
#include "tinker/types.hpp"

namespace rlforge::actors {

/// What the Tinker-compatible service (service/) computes with: the models of one base model,
/// their training steps, sampling and checkpoints. Plain C++ (no CAF, no torch in this header).
///
/// The service decodes request bodies (syntax only) and hands them over as they are; the backend
/// checks them once against the model (`tinker/datum_check.hpp`, the loss catalog) before
/// anything runs. Bad input throws `tinker::request_error` (user / not_found) naming what was
/// wrong, and the model stays as it was; other failures throw `request_error` (server). Messages
/// name checkpoints and samplers by their client-side names, never by server paths.
///
/// Thread-safety: every method may be called from any thread. Calls on one model's training
/// state (forward_backward, optim_step, checkpoints, sampler saves) are serialised by the backend;
/// the service also issues them in seq_id order, one at a time. `sample` runs concurrently with
/// everything, including the training of the model whose snapshot it samples.
/// What the service's `GET /metrics` reports of the backend, read at each scrape.
struct backend_stats {
  /// One inference engine's KV cache.
  struct engine_cache {
    std::string engine;        ///< "base", "model:<model_id>" (its snapshots), "checkpoint:<name>"
    int64_t blocks = 0;        ///< KV-cache blocks, over the engine's ranks
    int64_t blocks_in_use = 0; ///< held by requests (blocks that are neither free nor cached)
  };
  std::vector<engine_cache> engines;
  int64_t syncs = 0;       ///< weight syncs to the engines (sampler snapshots) so far
  int64_t sync_bytes = 0;  ///< bytes those syncs sent
  double sync_seconds = 0; ///< wall time those syncs took, summed
  int64_t recoveries = 0;      ///< lost ranks healed by placing again (tinker_healing.hpp)
  double recovery_seconds = 0; ///< wall time those re-placements took, summed
  int64_t models_rebuilt = 0;  ///< models rebuilt from their journal after a recovery
};

class tinker_backend {
public:
  virtual ~tinker_backend();

  /// Creates a trainable model on the server's base model.
  virtual void create_model(const std::string& model_id, const tinker::lora_config& lora,
                            tinker::model_role role) = 0;

  /// True when `model_id` was created and not deleted.
  virtual bool has_model(const std::string& model_id) = 0;

  /// Frees the model's memory and actors, including its sampling engine (its snapshots can no
  /// longer be sampled).
  virtual void delete_model(const std::string& model_id) = 0;

  /// Requests of ONE model, consecutive in seq_id order, same forward_only. One output per
  /// request, in order; each request's result is the same whatever requests arrive with it.
  virtual std::vector<tinker::forward_backward_output>
  forward_backward(const std::vector<tinker::forward_backward_request>& batch) = 0;

  /// One AdamW step with `p` on the accumulated gradients; returns metrics ("name:reduction").
  virtual std::map<std::string, double> optim_step(const std::string& model_id,
                                                   const tinker::adam_params& p) = 0;

  /// Binds the model's current weights to a sampler: returns the snapshot version that a
  /// `sampler_ref{snapshot, model_id, version}` samples from then on, unaffected by later
  /// training and saves, until the backend evicts it (a bounded cache; sampling an evicted
  /// snapshot is refused with a not_found error saying so, never answered from other weights).
  virtual int64_t save_sampler_snapshot(const std::string& model_id) = 0;

  /// Writes an HF export of the model's weights (LoRA merged) to the existing `where.dir`, which
  /// a `sampler_ref{checkpoint, dir}` samples from.
  virtual void export_sampler_weights(const std::string& model_id,
                                      const tinker::checkpoint_ref& where) = 0;

  /// Samples every request on the weights its `sampler` names. One response per request, in
  /// order.
  virtual std::vector<tinker::sample_response>
  sample(const std::vector<tinker::sample_request>& requests) = 0;

  /// Writes the model's full training state (weights, and the optimizer state when
  /// `with_optimizer`) into the existing directory `where.dir`.
  virtual void save_checkpoint(const std::string& model_id, const tinker::checkpoint_ref& where,
                               bool with_optimizer) = 0;

  /// Restores what `save_checkpoint` wrote (the optimizer state when `with_optimizer`).
  virtual void load_checkpoint(const std::string& model_id, const tinker::checkpoint_ref& where,
                               bool with_optimizer) = 0;

  /// Name of the base model every model is created on.
  virtual std::string base_model_name() const = 0;

  /// Where the base model's tokenizer is, as Hugging Face's `AutoTokenizer.from_pretrained`
  /// takes it (`get_info` reports it as `model_data.tokenizer_id`): the base model's directory
  /// on the server's host, absolute; nullopt when it holds no tokenizer.
  virtual std::optional<std::string> tokenizer_id() const = 0;

  /// Longest sequence (prompt + completion) the base model accepts, in tokens.
  virtual int64_t max_context_length() const = 0;

  /// Number of token ids of the base model's vocabulary.
  virtual int64_t vocab_size() const = 0;

  /// The engines' KV caches now and the syncs so far; never throws (an engine that does not
  /// answer within a few seconds is left out).
  virtual backend_stats stats() = 0;
};

} // namespace rlforge::actors
