#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <caf/actor.hpp>

#include "runtime/messages.hpp"

namespace rlforge::actors {

/// How a `dispatcher_backend` (dispatcher_backend.hpp) places and builds its models.
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
  /// Sampler snapshots (`save_sampler_snapshot`) each model's engine keeps addressable (≥ 1):
  /// the most recently used ones; sampling an older one is refused with a message saying so.
  /// Each costs one copy of the model's weights once newer weights replace it.
  size_t max_sampler_snapshots = 8;
  /// Precision of every model and engine: "fp32" (the default: a LoRA model's samplers get
  /// its merged weights, which in bf16 would differ from the trainer's unmerged bf16 forward by
  /// the merge's rounding) or "bf16" (mixed precision, model_spec::compute_dtype).
  std::string compute_dtype = "fp32";
  /// Batch-invariant numerics in trainers and engines (model_spec::batch_invariant).
  bool batch_invariant = false;
  /// Padding-free micro-batches of each model's passes (algorithm_config): rows sorted by length
  /// and packed within this many tokens (> 0). Small micro-batches also keep the activations in
  /// cache: 1,024-row passes ran 1.6x slower per token than 128-256-row ones here.
  int64_t max_tokens_per_micro_batch = 16384;
  /// Deadline of every call to the actor groups (> 0).
  std::chrono::milliseconds timeout = std::chrono::seconds(600);

  // -- healing (tinker_healing.hpp) ----------------------------------------------------------

  /// Losses of a rank (its node died or hung, its actor failed) the backend recovers from; 0 =
  /// none: a lost rank fails its model's calls (server errors naming the node).
  int max_restarts = 0;
  /// How to place the placement again when its node is lost (with `placement_manager`): the
  /// request the placement was created with. Its timeout is replaced by what is left of
  /// `recovery_timeout`.
  placement_group_request placement_request;
  /// How long one recovery may wait for room (> 0).
  std::chrono::milliseconds recovery_timeout = std::chrono::seconds(120);
  /// A model writes a recovery checkpoint (weights and optimizer) every this many optimizer
  /// steps (≥ 1), so a recovery replays at most that many steps of its calls.
  int64_t recovery_checkpoint_every = 10;
  /// Where recovery checkpoints are written (one directory per model; required when
  /// `max_restarts` > 0). On a cluster every node must see it at the same path.
  std::string recovery_dir;
};

} // namespace rlforge::actors
