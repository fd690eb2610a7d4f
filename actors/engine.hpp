#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <caf/actor.hpp>

#include <caf/atom.hpp>

#include "actors/rank_interface.hpp"
#include "actors/rank_op.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// Registers the inference-engine kind `engine` (idempotent). Spawn it as an actor group
/// (actor_group.hpp) with `collectives = false`; each rank is a detached actor owning one copy
/// of the model and a continuous-batching engine over it (backends/engine/continuous_engine.hpp).
///
/// ## How a rank runs
///
/// Requests join a running batch: between two messages the rank runs one engine step (one
/// forward pass: one new position for every running sequence, prefill chunks of new prompts,
/// admission of waiting requests while the KV-cache budget allows), and a request leaves the
/// batch the step it finishes, its result sent at once. Steps and messages interleave one at a
/// time on the rank's thread (the rank sends itself a step message after every op and step, so
/// calls that arrived meanwhile go first): an op is answered within one step's time, and weights
/// change only between two forward passes, never inside one. The n samples of a request share
/// one prefill of their prompt (copy-on-write of its last block); with `prefix_caching`, full
/// prompt blocks stay cached for later requests on the same weights. When the KV cache is full,
/// the most recently arrived requests are preempted and recomputed later (never failed; a
/// request that could never fit is refused when submitted). Sampling semantics are those of
/// `backends::generate` run on each sample alone: a seeded sample gets the same tokens whatever
/// its batch-mates (log-probs equal to float rounding). A row with `stop_strings` stops with the
/// token after which its decoded text contains one (backends/model/stop_strings.hpp), in the
/// step that produced it, freeing its KV blocks like any finished row.
///
/// Weights: a request's `weight_version` 0 runs on the live weights and follows updates (see
/// `pause`); v >= 1 runs exactly on version v (the current one, or a retained snapshot), also
/// after newer weights arrive. Every row reports per token the version that produced it
/// (`sample_output::token_versions`). A forward pass runs one version only.
///
/// ## Ops (arguments → result; wire types in runtime/messages.hpp)
///
///  - `init_model` (model_spec) → int64 number of parameters. Builds the model from exactly one
///    of hf_dir, preset and config_json (random weights from the seed; `lora_rank` must be 0:
///    an engine serves merged weights; `untie_word_embeddings` gives a tied lm_head its own
///    copy, for the merged weights of a model whose unembedding was adapted) and a fresh engine
///    with the current `configure` settings (its KV cache reserved). Resets the weight version to
///    0, drops retained versions, wakes the engine and leaves the pause state unchanged. Requests
///    in flight are answered with an error. The tokenizer for stop strings comes from
///    `tokenizer_dir` (refused when that holds no tokenizer.json or tokenizer.model), else from
///    `hf_dir` when it has one; one that fails to load (malformed, or a SentencePiece model in a
///    process with libtorch) only leaves the engine without stop strings, and requests asking for
///    them are refused naming why.
///  - `configure` (engine_options) → (): KV-cache budget (`kv_cache_bytes`, reserved while the
///    cache is awake and reported by `memory`; the pool holds budget / block bytes blocks of
///    `block_size` positions), `max_num_seqs` sequences decoded together, `max_step_tokens`
///    tokens per forward pass (>= max_num_seqs) and `prefix_caching`. Defaults: 256 MiB, 16,
///    256, 2048, on. Refused while requests are in flight or queued, or when the budget is below
///    one block of the model. Rebuilds the engine.
///  - `generate` (std::vector<sample_request>) → std::vector<sample_output>: answered when the
///    last of its requests finishes (the reply is deferred; the caller's own deadline applies).
///    A request with `num_samples` = n becomes n consecutive output rows, samples
///    `first_sample .. first_sample + n - 1`; with a seed s, sample j draws from
///    `sample_seed(s, j)` (backends/model/sampling_params.hpp), so a sample's tokens depend only
///    on (s, j), not on its batch-mates or on how the request was sliced. Outputs are in request
///    order. Refused before any work, naming the request index and the bad value: an empty list,
///    an empty prompt, a prompt that fills the model's context, a token id outside the
///    vocabulary, max_tokens <= 0, num_samples < 1, first_sample < 0, weight_version < 0,
///    invalid sampling parameters, an empty stop string, stop strings on an engine without a
///    tokenizer ("stop strings need the model's tokenizer; 'DIR' has none ..."), a request whose
///    worst case exceeds the KV cache, and
///    (`not_found`, naming both versions) a version neither current nor retained. On a sleeping
///    engine: "engine is asleep (weights); call wake_up" (or `(kv_cache)`). While paused the
///    call is queued (unchecked) and started by `resume`.
///  - `submit` (caf::actor consumer, std::vector<int64_t> ids, std::vector<sample_request>,
///    int64 timeout_ms) → int64 requests accepted: the streaming form for a producer that keeps
///    the engine busy. Each request is checked as for `generate` (all or none are accepted) and
///    runs like one; as soon as it finishes, the engine sends `consumer` a `generation_result`
///    (id, its num_samples rows, engine rank). Ids are the caller's, unique per consumer among
///    its requests in flight. A request not finished `timeout_ms` after submission is stopped
///    and delivered with what it generated, unfinished rows "abort", and `error_code` timeout.
///    Results of requests finishing in the same step arrive oldest first. While paused,
///    submissions are accepted and start at `resume`. If the engine dies, its consumers get
///    nothing more: a consumer that monitors the rank (or submits through the dispatcher, which
///    reports them) requeues the ids it has no result for.
///  - `cancel` (caf::actor consumer, std::vector<int64_t> ids) → int64 stopped: each request of
///    the consumer still queued or running is stopped and delivered (unfinished rows "abort");
///    unknown ids are skipped.
///  - `pause` ([std::string mode]) → int64 requests handed back. From now on no step runs and
///    new `generate` calls and submissions queue until `resume`; other ops keep working (a
///    weight transfer then happens between two steps without draining). Mode `keep` (default):
///    requests in flight stay where they are and continue after `resume` on whatever weights
///    are then live (their later tokens carry the new version; their cached keys/values of
///    earlier positions are kept). Mode `abort`: every request in flight or queued is stopped
///    and handed back now, `generate` calls answered with their rows so far and stream requests
///    delivered to their consumers, unfinished rows with stop_reason "abort" and the tokens they
///    had (resubmit them; a seeded sample resubmitted from scratch repeats its tokens).
///  - `resume` → int64 queued calls and submissions released: starts them in arrival order on
///    the weights in place; refusals are answered to their callers/consumers.
///  - `retain_weights` (int64 version, int64 max_retained) → std::vector<int64_t> evicted: keeps
///    the current weights (which must be `version`) addressable by requests after newer weights
///    arrive: a copy is taken when they are replaced (`receive_weights`, `set_weights`). At most
///    `max_retained` versions stay retained; beyond that the least recently used ones (never the
///    current) are dropped and returned (a dropped copy still serving running requests stays
///    until they finish). Copies count as resident bytes in `memory`. `init_model` drops them.
///  - `sleep` (std::vector<std::string> tags) → (): `weights` moves every parameter's storage
///    out of the model into host buffers kept by the engine (the model's tensors become empty);
///    `kv_cache` frees the KV cache (requests in flight are preempted: they recompute after
///    `wake_up`). No step runs while a tag sleeps. An empty list means both tags. Sleeping an
///    asleep tag is a no-op.
///  - `wake_up` (std::vector<std::string> tags) → (): puts the saved storage back (the values
///    are bit-identical to those before `sleep`) and reserves the KV cache again; an empty list
///    means both tags. Unknown tags are refused by both ops, naming the tag.
///  - `memory` → (int64 resident_bytes, int64 host_bytes): bytes the engine holds on its device
///    (parameters with distinct storages counted once, retained copies, the KV cache's reserved
///    budget while awake) and bytes held off-device by a sleeping engine.
///  - `stats` → std::string JSON: KV blocks (`num_blocks`, `free_blocks`, `cached_blocks`,
///    `block_size`, `kv_cache_bytes`), `running` / `waiting` requests, `queued_calls`,
///    `paused`, `weight_version`, and counters since the engine was built: `prompt_tokens`
///    (prompt positions prefilled; a prompt shared by n samples counts once),
///    `recompute_tokens`, `decode_tokens`, `generated_tokens`, `prefix_query_tokens`,
///    `prefix_hit_tokens`, `prefix_hit_rate`, `preemptions`, `copies`, `steps`; `busy_seconds`
///    (wall time in forward passes since the rank started) and `in_flight_tokens` (tokens the
///    queued and running requests sampled so far: the partial rows).
///  - `weight_version` → int64: 0 after `init_model`, then the version of the last accepted
///    `set_weights` / `receive_weights`.
///  - `set_weights` (tensor_map weights, int64 version) → (): the map must hold exactly the
///    model's parameter names with the same shapes and dtypes, and the version must be >= 0; a
///    refused transfer (naming the bad name, shape, dtype or version) changes neither the
///    weights nor the version. Refused while the weights sleep. Requests on the live weights
///    continue on the new ones from the next step; cached prefixes are dropped.
///  - `receive_weights` (weight_sync_spec) → int64 version: the receiving end of a sync the
///    dispatcher planned (actors/weight_sync.hpp): waits for the trainer's transfer over the
///    spec's transport and commits it into the live parameters, as `set_weights`. A refused
///    transfer (a version not above the current one, other names, shapes or dtypes) changes
///    neither the weights nor the version and is reported to the sender too. Refused while the
///    weights sleep. After a transfer that broke half-way (the shared-memory ring when the
///    sender stops mid-stream) the version is 0 until the next complete transfer.
///  - `get_weights` → tensor_map: copies of the model's parameters under their names (the
///    payload `set_weights` takes). Refused while the weights sleep.
///
/// ## For an asynchronous RL loop
///
/// A rollout producer submits prompts with `submit` (to a rank, or through the dispatcher's
/// `submit`, which spreads them and reports requests lost with a dead engine) whenever it has
/// room, and its consumer actor receives each `generation_result` as the request finishes. To
/// move new weights in without draining: `pause` (keep) → `receive_weights` → `resume`, and the
/// partial rollouts go on with their tokens tagged per version (the dispatcher's
/// `save_weights_for_sampler` does exactly this when the engines are not colocated); or
/// `pause("abort")` → sync → `resume`, and resubmit the rollouts handed back.
///
/// Every op before `init_model` (except the built-ins) is refused with an error saying so.
/// A failing op leaves the engine as it was; the engine stays usable. A step that fails
/// (an internal error) fails the requests of the weights version it ran, not the engine.
void register_engine_kind();

/// The engine kind's ops, with their argument and answer types as above (op_ref, rank_op.hpp):
/// the kind is built from these and every caller calls through them.
namespace engine_ops {
inline constexpr op_ref<int64_t(model_spec)> init_model{"init_model", caf::atom("init_model")};
inline constexpr op_ref<no_values(engine_options)> configure{"configure", caf::atom("configure")};
inline constexpr op_ref<std::vector<sample_output>(std::vector<sample_request>)> generate{
    "generate", caf::atom("generate")};
inline constexpr op_ref<int64_t(caf::actor, std::vector<int64_t>, std::vector<sample_request>,
                                int64_t)>
    submit{"submit", caf::atom("submit")};
inline constexpr op_ref<int64_t(caf::actor, std::vector<int64_t>)> cancel{"cancel",
                                                                          caf::atom("cancel")};
inline constexpr op_ref<no_values(std::vector<std::string>)> sleep{"sleep", caf::atom("sleep")};
inline constexpr op_ref<no_values(std::vector<std::string>)> wake_up{"wake_up",
                                                                     caf::atom("wake_up")};
inline constexpr op_ref<std::tuple<int64_t, int64_t>()> memory{"memory", caf::atom("memory")};
inline constexpr op_ref<int64_t(std::optional<std::string>)> pause{"pause", caf::atom("pause")};
inline constexpr op_ref<int64_t()> resume{"resume", caf::atom("resume")};
inline constexpr op_ref<int64_t()> weight_version{"weight_version", caf::atom("weight_ver")};
inline constexpr op_ref<no_values(tensor_map, int64_t)> set_weights{"set_weights",
                                                                    caf::atom("set_wts")};
inline constexpr op_ref<tensor_map()> get_weights{"get_weights", caf::atom("get_wts")};
inline constexpr op_ref<std::vector<int64_t>(int64_t, int64_t)> retain_weights{
    "retain_weights", caf::atom("retain_wts")};
inline constexpr op_ref<int64_t(weight_sync_spec)> receive_weights{"receive_weights",
                                                                   caf::atom("recv_wts")};
inline constexpr op_ref<std::string()> stats{"stats", caf::atom("stats")};
} // namespace engine_ops

/// The engine kind's typed CAF interface (rank_interface.hpp).
using engine_interface =
    rank_interface<engine_ops::init_model, engine_ops::configure, engine_ops::generate,
                   engine_ops::submit, engine_ops::cancel, engine_ops::sleep, engine_ops::wake_up,
                   engine_ops::memory, engine_ops::pause, engine_ops::resume,
                   engine_ops::weight_version, engine_ops::set_weights, engine_ops::get_weights,
                   engine_ops::retain_weights, engine_ops::receive_weights, engine_ops::stats>;

} // namespace rlforge::actors
