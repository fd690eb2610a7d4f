#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/tinker_types.hpp"

namespace rlforge::actors {

/// What the Tinker-compatible service (service/) computes with: the models of one base model,
/// their training steps, sampling and checkpoints. Plain C++ (no CAF, no torch in this header).
///
/// All methods may block: the server calls them from worker threads, never concurrently for one
/// model. Bad input throws `tinker::request_error` ("user" / "not_found") naming what was wrong,
/// and the model stays usable; other failures throw `request_error` with category "server".
class tinker_backend {
public:
  virtual ~tinker_backend();

  /// Creates a trainable model on the server's base model; `role` is "policy" or "critic".
  virtual void create_model(const std::string& model_id, const tinker::lora_config& lora,
                            const std::string& role) = 0;

  /// True when `model_id` was created and not deleted.
  virtual bool has_model(const std::string& model_id) = 0;

  /// Frees the model's memory and actors.
  virtual void delete_model(const std::string& model_id) = 0;

  /// Requests of ONE model, consecutive in seq_id order, same forward_only; the server batches
  /// them (they may carry different loss_fn/config: the backend groups as it needs). One output
  /// per request, in order.
  virtual std::vector<tinker::forward_backward_output>
  forward_backward(const std::vector<tinker::forward_backward_request>& batch) = 0;

  /// One AdamW step with `p` on the accumulated gradients; returns metrics ("name:reduction").
  virtual std::map<std::string, double> optim_step(const std::string& model_id,
                                                   const tinker::adam_params& p) = 0;

  /// Samples every request from `model_id`'s current sampler weights; `model_id` empty = the
  /// base model. One response per request, in order.
  virtual std::vector<tinker::sample_response>
  sample(const std::string& model_id, const std::vector<tinker::sample_request>& requests) = 0;

  /// Writes the model's full training state (weights, and the optimizer state when
  /// `with_optimizer`) into the existing directory `dir`.
  virtual void save_checkpoint(const std::string& model_id, const std::string& dir,
                               bool with_optimizer) = 0;

  /// Restores what `save_checkpoint` wrote to `dir` (the optimizer state when `with_optimizer`).
  virtual void load_checkpoint(const std::string& model_id, const std::string& dir,
                               bool with_optimizer) = 0;

  /// persist: write an HF export (config.json + model.safetensors, LoRA merged) to dir;
  /// otherwise sync weights to the engines and write only a marker file in dir.
  virtual void save_sampler_checkpoint(const std::string& model_id, const std::string& dir,
                                       bool persist) = 0;

  /// Name of the base model every model is created on.
  virtual std::string base_model_name() const = 0;

  /// Longest sequence (prompt + completion) the base model accepts, in tokens.
  virtual int64_t max_context_length() const = 0;

  /// Number of token ids of the base model's vocabulary.
  virtual int64_t vocab_size() const = 0;
};

} // namespace rlforge::actors
