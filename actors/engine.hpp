#pragma once

namespace rlforge::actors {

/// Registers the inference-engine kind `engine` (idempotent). Spawn it as an actor group
/// (actor_group.hpp) with `collectives = false`; each rank is a detached actor owning one copy
/// of the model and sampling from it with `backends::generate`.
///
/// Ops (arguments → result; wire types in runtime/messages.hpp):
///  - `init_model` (model_spec) → int64 number of parameters. Builds the model from exactly one
///    of hf_dir, preset and config_json (random weights from the seed; `lora_rank` must be 0:
///    an engine serves merged weights; `untie_word_embeddings` gives a tied lm_head its own
///    copy, for the merged weights of a model whose unembedding was adapted). Resets the weight
///    version to 0, drops retained versions, wakes the engine and leaves the pause state
///    unchanged.
///  - `generate` (std::vector<sample_request>) → std::vector<sample_output>. Rows on the same
///    weights run as one batch. A request with `num_samples` = n becomes n consecutive output
///    rows, samples `first_sample .. first_sample + n - 1`; with a seed s, sample j draws from
///    `sample_seed(s, j)` (backends/model/sampling_params.hpp), so a sample's tokens depend only
///    on (s, j), not on its batch-mates or on how the request was sliced. A request's
///    `weight_version` v > 0 other than the current version runs on the retained snapshot of v
///    (see `retain_weights`; swapped in for that batch only, so a forward pass never mixes two
///    versions) and is refused (`not_found`, naming both versions) when v is not retained.
///    Outputs are in request order. Refused before any work, naming the request index and the
///    bad value: an empty list, an empty prompt, a prompt that fills the model's context, a token
///    id outside the vocabulary, max_tokens <= 0, num_samples < 1, first_sample < 0, invalid
///    sampling parameters. On a sleeping engine: "engine is asleep (weights); call wake_up" (or
///    `(kv_cache)`). While paused the call is queued and answered after `resume`, in arrival
///    order (through the rank's deferred replies, `rank_context::defer_reply`); the caller's own
///    deadline still applies, so a caller that times out before `resume` sees a timeout.
///  - `retain_weights` (int64 version, int64 max_retained) → std::vector<int64_t> evicted: keeps
///    the current weights (which must be `version`) addressable by `generate` after newer weights
///    arrive: a copy is taken when they are replaced (`receive_weights`, `set_weights`). At most
///    `max_retained` versions stay retained; beyond that the least recently used ones (never the
///    current) are dropped and returned. Retained copies count as resident bytes in `memory`.
///    `init_model` drops them all.
///  - `sleep` (std::vector<std::string> tags) → (): `weights` moves every parameter's storage
///    out of the model into host buffers kept by the engine (the model's tensors become empty,
///    so `memory` reports ~0 resident bytes); `kv_cache` releases the key/value cache memory
///    (the cache lives only during a `generate` call, so this only blocks generation until
///    woken). An empty list means both tags. Sleeping an asleep tag is a no-op.
///  - `wake_up` (std::vector<std::string> tags) → (): puts the saved storage back (the values
///    are bit-identical to those before `sleep`); an empty list means both tags. Unknown tags
///    are refused by both ops, naming the tag.
///  - `memory` → (int64 resident_bytes, int64 host_bytes): bytes of parameter storage the model
///    holds (distinct storages counted once) and bytes held off-device by a sleeping engine.
///  - `pause` → (): from now on `generate` calls are queued, not run. Other ops keep working.
///  - `resume` → int64 number of queued calls answered: runs the queued calls in arrival order
///    (with the weights in place at resume time) and answers each, then answers `resume`.
///  - `weight_version` → int64: 0 after `init_model`, then the version of the last accepted
///    `set_weights`.
///  - `set_weights` (tensor_map weights, int64 version) → (): the map must hold exactly the
///    model's parameter names with the same shapes and dtypes, and the version must be >= 0; a
///    refused transfer (naming the bad name, shape, dtype or version) changes neither the
///    weights nor the version. Refused while the weights sleep.
///  - `receive_weights` (weight_sync_spec) → int64 version: the receiving end of a sync the
///    dispatcher planned (actors/weight_sync.hpp): waits for the trainer's transfer over the
///    spec's transport and commits it into the live parameters. A refused transfer (a version
///    not above the current one, other names, shapes or dtypes) changes neither the weights nor
///    the version and is reported to the sender too. Refused while the weights sleep. After a
///    transfer that broke half-way (the shared-memory ring when the sender stops mid-stream)
///    the version is 0 until the next complete transfer.
///  - `get_weights` → tensor_map: copies of the model's parameters under their names (the
///    payload `set_weights` takes). Refused while the weights sleep.
///
/// Every op before `init_model` (except the built-ins) is refused with an error saying so.
/// A failing op leaves the engine as it was; the engine stays usable.
void register_engine_kind();

} // namespace rlforge::actors
