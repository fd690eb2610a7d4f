#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/atom.hpp>

#include "actors/rank_interface.hpp"
#include "actors/rank_op.hpp"
#include "backends/model/compute_dtype.hpp"
#include "runtime/messages.hpp"

namespace rlforge::backends {
class causal_lm;
} // namespace rlforge::backends

namespace rlforge::actors {

struct rank_context;
class weight_channels;

/// Registers the training worker kinds (idempotent): `policy`, `critic` and `ref`. Spawn them
/// as actor groups (actor_group.hpp); each rank is a detached actor owning one model replica.
///
/// Ops (arguments → result; all wire types are in runtime/messages.hpp):
///  - `init_model` (model_spec) → int64 number of parameters. Builds the model (HF directory,
///    preset or config JSON, random weights from the seed), adds LoRA adapters when asked, a
///    value head for a critic, and the optimizer and LR schedule (not for `ref`). With more
///    than one rank, rank 0's weights are broadcast so every replica starts identical. With
///    LoRA on an HF directory the frozen base weights are shared with every other model of the
///    process built from that directory (base_weights.hpp: one copy, freed with the last model).
///  - `forward` (batch_payload[, loss_request]) → batch_result, no gradients: per row `[b, R]`
///    outputs `logprobs` and `entropy` (policy, ref) or `values` (critic), zero outside the
///    response; with a loss request also `elementwise_loss` and the loss's metrics, computed
///    exactly as `forward_backward` computes them (same inputs, regularizers and checks).
///    A position is scored on the batch's `target_tokens` when it carries them (Tinker datums),
///    else on the sequence's next token.
///  - `forward_backward` (batch_payload, loss_request) → batch_result (policy, critic): runs
///    micro-batches (`algorithm_config::micro_batch_size` rows), accumulating gradients until
///    the next `optim_step`. Outputs `logprobs`, `entropy` and `elementwise_loss` (policy) or
///    `values` and `elementwise_loss` (critic); metrics `name:reduction` from the loss
///    (`loss:sum` is the masked SUM). A policy takes every policy loss of backends/algo, a critic
///    only `ppo_critic`. Bad input (mismatched shapes, unknown loss, missing inputs, NaN/inf,
///    empty batch, token ids outside the vocabulary) is refused before any gradient changes.
///  - `tinker_forward_backward` (tinker::checked_request) → tinker_pass_result (policy, critic):
///    a Tinker request the backend checked (`tinker::check_request`: its loss resolved for the
///    model's role, its datums against the model), computed without checking again. The
///    tensors are built from the datums in pieces of at most `tinker_tokens_per_piece` padded
///    tokens, each run as `forward_backward` runs a batch; per datum `logprobs` (policy) or
///    `values` (critic) and `elementwise_loss`, and the loss's metrics with `loss:sum`.
///    `tinker_forward` (tinker::checked_request) → tinker_pass_result: the same without
///    gradients (also on `ref`). The dispatcher splits the datums over the ranks
///    (op_route::split_datums); a rank given none answers an empty result.
///  - `optim_step` (tinker::adam_params; a negative learning_rate takes the schedule's) →
///    optim_result: all-reduces (SUM) the gradients over the group's collective, then AdamW
///    with global-norm clipping; a non-finite norm skips the step (`skipped`, nothing changes).
///    Gradients are cleared afterwards either way.
///  - `set_lr` (double) → (): the learning rate used by requests with a negative rate.
///  - `set_algorithm_config` (algorithm_config) → ().
///  - `save_checkpoint` (std::string root, int64 global_step[, std::string role]) → (): this
///    rank's state in `root/global_step_N/<role>/rank_<r>/` (backends/train/checkpoint.hpp);
///    `role` defaults to the kind's name (trainer_client passes the dispatcher role).
///  - `load_checkpoint` (std::string root, int64 global_step[, std::string role[, bool
///    with_optimizer]]) → int64 step loaded; a negative step loads `latest_global_step.txt`.
///    `with_optimizer` false (default true) loads only the weights: the optimizer starts fresh,
///    schedule and RNG stay. A checkpoint of another world size is refused; a refused
///    checkpoint changes nothing.
///  - `save_hf_model` (std::string dir) → (): rank 0 writes config.json + model.safetensors (LoRA
///    merged); the other ranks do nothing.
///  - `offload` (std::vector<std::string> tags) → (): moves state off the device into host
///    buffers the rank holds, so colocated models can take turns on one device. Tags: `model`
///    (every parameter and its accumulated gradient) and `optimizer` (the AdamW moments and step
///    counts; not on `ref`); an empty list means all of the kind's. Each storage is copied once
///    (tensors sharing one stay shared) into separately allocated host memory — pinned when the
///    model is on a CUDA device — and the device copy is freed; the model's parameter tensors
///    stay the same objects, holding no storage. Offloading what is already offloaded does
///    nothing. An unknown tag, or `optimizer` on a ref worker, is refused before anything moves.
///  - `onload` (std::vector<std::string> tags) → (): the reverse, onto the device the state left;
///    parameters, gradients, moments and step counts come back bit for bit. Onloading what is
///    resident does nothing.
///  - `memory` () → (int64 resident_bytes, int64 host_bytes): bytes of storage on the device
///    (parameters, gradients, optimizer moments; a storage shared by several tensors counted
///    once) and bytes held in the host buffers, as the engine's `memory`.
///
/// While the model is offloaded, `forward`, `forward_backward`, `optim_step`, `save_hf_model`,
/// `save_checkpoint` and `load_checkpoint` are refused ("... needs the model on the device but it
/// is offloaded; call onload"); while the optimizer is, so are `optim_step`, `save_checkpoint`
/// and `load_checkpoint`. No op onloads by itself (the dispatcher does). `init_model` starts over
/// with everything on the device and the host buffers dropped.
///
/// A failing op answers an error naming group, rank and op and leaves the rank's state as it
/// was; the rank stays usable.
void register_worker_kinds();

/// Padded tokens (rows × longest row) one piece of a Tinker request holds at most in the
/// workers' `tinker_forward_backward` / `tinker_forward`: a request with more is computed in
/// consecutive pieces of whole datums (the losses are sums, so the pieces add up to the
/// request's loss and gradient).
inline constexpr int64_t tinker_tokens_per_piece = 65536;

/// The worker kinds' ops, with their argument and answer types as above (op_ref, rank_op.hpp):
/// the kinds are built from these and every caller calls through them. `forward_backward`,
/// `tinker_forward_backward`, `optim_step`, `set_lr` and the checkpoints are not on `ref`.
namespace worker_ops {
inline constexpr op_ref<int64_t(model_spec)> init_model{"init_model", caf::atom("init_model")};
inline constexpr op_ref<tinker_pass_result(tinker::checked_request)> tinker_forward{
    "tinker_forward", caf::atom("tk_fwd")};
inline constexpr op_ref<tinker_pass_result(tinker::checked_request)> tinker_forward_backward{
    "tinker_forward_backward", caf::atom("tk_fwd_bwd")};
inline constexpr op_ref<batch_result(batch_payload, std::optional<loss_request>)> forward{
    "forward", caf::atom("forward")};
inline constexpr op_ref<batch_result(batch_payload, loss_request)> forward_backward{
    "forward_backward", caf::atom("fwd_bwd")};
inline constexpr op_ref<optim_result(tinker::adam_params)> optim_step{"optim_step",
                                                                      caf::atom("optim_step")};
inline constexpr op_ref<no_values(double)> set_lr{"set_lr", caf::atom("set_lr")};
inline constexpr op_ref<no_values(algorithm_config)> set_algorithm_config{"set_algorithm_config",
                                                                          caf::atom("set_algo")};
inline constexpr op_ref<no_values(std::string, int64_t, std::optional<std::string>)>
    save_checkpoint{"save_checkpoint", caf::atom("save_ckpt")};
inline constexpr op_ref<int64_t(std::string, int64_t, std::optional<std::string>,
                                std::optional<bool>)>
    load_checkpoint{"load_checkpoint", caf::atom("load_ckpt")};
inline constexpr op_ref<no_values(std::string)> save_hf_model{"save_hf_model",
                                                              caf::atom("save_hf")};
inline constexpr op_ref<no_values(std::vector<std::string>)> offload{"offload",
                                                                     caf::atom("offload")};
inline constexpr op_ref<no_values(std::vector<std::string>)> onload{"onload", caf::atom("onload")};
inline constexpr op_ref<std::tuple<int64_t, int64_t>()> memory{"memory", caf::atom("memory")};
/// Sends this rank's weights to engines (weight_sync.hpp) → the bytes this rank sent.
inline constexpr op_ref<int64_t(std::vector<weight_sync_spec>)> send_weights{"send_weights",
                                                                             caf::atom("send_wts")};
} // namespace worker_ops

/// The worker kinds' typed CAF interfaces (rank_interface.hpp): `ref` reads the model;
/// `policy` and `critic` also train it and keep checkpoints.
using reference_interface =
    rank_interface<worker_ops::init_model, worker_ops::forward, worker_ops::tinker_forward,
                   worker_ops::set_algorithm_config, worker_ops::save_hf_model, worker_ops::offload,
                   worker_ops::onload, worker_ops::memory, worker_ops::send_weights>;
using trainer_interface =
    rank_interface<worker_ops::init_model, worker_ops::forward, worker_ops::tinker_forward,
                   worker_ops::set_algorithm_config, worker_ops::save_hf_model, worker_ops::offload,
                   worker_ops::onload, worker_ops::memory, worker_ops::send_weights,
                   worker_ops::forward_backward, worker_ops::tinker_forward_backward,
                   worker_ops::optim_step, worker_ops::set_lr, worker_ops::save_checkpoint,
                   worker_ops::load_checkpoint>;

/// Builds the model a `model_spec` names: loaded from `hf_dir`, or random from `preset` or
/// `config_json` with `spec.seed`. Exactly one of the three must be set. LoRA fields are not
/// applied here. Throws `backends::error` naming the problem. Shared by workers and engines.
std::unique_ptr<backends::causal_lm> build_model(const model_spec& spec);

/// The compute dtype `spec` asks for: its `compute_dtype`, or this node's default when empty.
/// Throws `backends::error(invalid_argument)` naming a value other than "", fp32 and bf16.
backends::compute_dtype compute_dtype_of(const model_spec& spec);

/// The model of a worker rank, for ops added to the worker kinds elsewhere (weight sync): `ctx`
/// must be the context of a `policy`, `critic` or `ref` rank. Throws
/// `backends::error{invalid_argument}` naming `op` and the rank's role before `init_model` and
/// while the model is offloaded (the caller should onload first).
const backends::causal_lm& worker_model(rank_context& ctx, const char* op);

/// The Gloo weight channels a worker rank keeps open to its engines (weight_sync.hpp), for the
/// `send_weights` op. `ctx` must be the context of a worker rank.
weight_channels& worker_weight_channels(rank_context& ctx);

/// The names of the worker kinds: policy, critic, ref.
const std::vector<std::string>& worker_kind_names();

} // namespace rlforge::actors
