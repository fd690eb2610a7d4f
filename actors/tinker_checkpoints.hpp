#pragma once

#include <string>

#include <caf/actor.hpp>

#include "actors/tinker_groups.hpp"
#include "actors/tinker_models.hpp"
#include "tinker/types.hpp"

/// Checkpoints of the Tinker backend (dispatcher_backend.hpp) on one locked model. Every message
/// names the checkpoint by `checkpoint_ref::name`; a server path never reaches the client.
namespace rlforge::actors {

/// Writes the full training state of `m` (weights, AdamW moments, schedule, RNG) under
/// `where.dir/global_step_0/model/rank_0/` plus `where.dir/tinker_checkpoint.json` (role, LoRA
/// rank and targets, whether the optimizer was asked for, base model). `dir` must exist.
void save_tinker_checkpoint(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                            const tinker::checkpoint_ref& where, bool with_optimizer,
                            const std::string& base_model);

/// Restores what `save_tinker_checkpoint` wrote: everything with `with_optimizer` (training then
/// resumes bit for bit), else the weights only (the optimizer starts fresh). A checkpoint of
/// another role, LoRA rank or set of adapted parts, one saved without optimizer state when it
/// is asked for, or a directory that is not a checkpoint of this server is refused (user) naming
/// both sides; a refused load changes nothing.
void load_tinker_checkpoint(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                            const tinker::checkpoint_ref& where, bool with_optimizer);

/// Writes an HF export of `m`'s weights (config.json + model.safetensors, LoRA merged) to
/// `where.dir`, which `tinker_sampling` serves as a persisted sampler checkpoint.
void export_tinker_sampler_weights(tinker_groups& groups, const caf::actor& dispatcher,
                                   tinker_model& m, const tinker::checkpoint_ref& where);

} // namespace rlforge::actors
