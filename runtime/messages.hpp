#pragma once

// Plain-data message types that cross actor and node boundaries. Every type here has a CAF 0.17
// `inspect` overload and is registered once, in `runtime/type_registry.cpp` (the list
// `message_types` below); tests/runtime/message_roundtrip_test.cpp sends each across a real
// loopback connection.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>

#include "runtime/errc.hpp"
#include "runtime/rendezvous_protocol.hpp"
#include "runtime/tensor_blob.hpp"
#include "tinker/datum_check.hpp"
#include "tinker/loss_catalog.hpp"
#include "tinker/types.hpp"

namespace rlforge {

/// Named resource amounts as the user writes them ({"GPU": 0.2, "CPU": 1}).
using resource_amounts = std::map<std::string, double>;

/// What one node offers: CPUs, memory and GPUs (real CUDA devices or virtual ones).
struct node_resources {
  std::string node_id;
  int32_t cpus = 0;
  int64_t memory_bytes = 0;
  int32_t gpus = 0;
  bool virtual_gpus = true; ///< true: actors on these "GPUs" compute on the CPU
  std::map<std::string, double> custom;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_resources& x) {
  return f(caf::meta::type_name("node_resources"), x.node_id, x.cpus, x.memory_bytes, x.gpus,
           x.virtual_gpus, x.custom);
}

inline bool operator==(const node_resources& a, const node_resources& b) {
  return a.node_id == b.node_id && a.cpus == b.cpus && a.memory_bytes == b.memory_bytes &&
         a.gpus == b.gpus && a.virtual_gpus == b.virtual_gpus && a.custom == b.custom;
}

/// A request for a placement group: bundles of resources and a strategy name
/// (`pack`, `spread`, `strict_pack`, `strict_spread`).
struct placement_group_request {
  std::string name;
  std::vector<resource_amounts> bundles;
  std::string strategy = "pack";
  double timeout_s = 0; ///< 0 = the manager's default (RLFORGE_PG_TIMEOUT_S, 180 s)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_group_request& x) {
  return f(caf::meta::type_name("placement_group_request"), x.name, x.bundles, x.strategy,
           x.timeout_s);
}

inline bool operator==(const placement_group_request& a, const placement_group_request& b) {
  return a.name == b.name && a.bundles == b.bundles && a.strategy == b.strategy &&
         a.timeout_s == b.timeout_s;
}

/// One placed bundle: where it is and which devices it owns.
struct bundle_placement {
  uint32_t bundle_index = 0; ///< index in the request
  std::string node_id;
  std::vector<int32_t> device_ids;
  resource_amounts resources;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, bundle_placement& x) {
  return f(caf::meta::type_name("bundle_placement"), x.bundle_index, x.node_id, x.device_ids,
           x.resources);
}

inline bool operator==(const bundle_placement& a, const bundle_placement& b) {
  return a.bundle_index == b.bundle_index && a.node_id == b.node_id &&
         a.device_ids == b.device_ids && a.resources == b.resources;
}

/// A placed group: its bundles ordered by (node, device), so rank i → bundles[i].
struct placement_group_info {
  std::string name;
  std::string strategy;
  std::vector<bundle_placement> bundles;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_group_info& x) {
  return f(caf::meta::type_name("placement_group_info"), x.name, x.strategy, x.bundles);
}

inline bool operator==(const placement_group_info& a, const placement_group_info& b) {
  return a.name == b.name && a.strategy == b.strategy && a.bundles == b.bundles;
}

/// What a rank of an actor group knows about itself.
struct rank_info {
  std::string group;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string node_id;
  std::vector<int32_t> device_ids;
  double gpu_fraction = 0; ///< share of the bundle's GPU this rank holds (0.2 when colocated)
  int32_t threads = 1;     ///< torch intra-op threads this rank uses
  bool virtual_gpu = true;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, rank_info& x) {
  return f(caf::meta::type_name("rank_info"), x.group, x.rank, x.world_size, x.node_id,
           x.device_ids, x.gpu_fraction, x.threads, x.virtual_gpu);
}

inline bool operator==(const rank_info& a, const rank_info& b) {
  return a.group == b.group && a.rank == b.rank && a.world_size == b.world_size &&
         a.node_id == b.node_id && a.device_ids == b.device_ids &&
         a.gpu_fraction == b.gpu_fraction && a.threads == b.threads &&
         a.virtual_gpu == b.virtual_gpu;
}

/// How the ranks of a group rendezvous for collectives: in one process through a named
/// in-process store ("local"), or across processes through a rendezvous store actor served in
/// the driver's process and reached over the cluster's own connections ("actor"; no port opens).
struct collective_spec {
  std::string store = "local";       ///< "local" or "actor"
  std::string name;                  ///< unique per group (store key prefix, group name)
  rendezvous_store_actor store_actor; ///< "actor": the group's store
  int64_t timeout_ms = 30000;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, collective_spec& x) {
  return f(caf::meta::type_name("collective_spec"), x.store, x.name, x.store_actor, x.timeout_ms);
}

inline bool operator==(const collective_spec& a, const collective_spec& b) {
  return a.store == b.store && a.name == b.name && a.store_actor == b.store_actor &&
         a.timeout_ms == b.timeout_ms;
}

/// The reply of one rank to one op: whatever the op returned, as one message. (A bare
/// `caf::message` reply would be flattened into the response itself.)
struct op_result {
  caf::message value;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, op_result& x) {
  return f(caf::meta::type_name("op_result"), x.value);
}

inline bool operator==(const op_result& a, const op_result& b) {
  return to_string(a.value) == to_string(b.value);
}

/// A list of tensors (a batch chunk, a gradient bucket) in wire form.
using tensor_list = std::vector<tensor_blob>;

// -- training workers and the dispatcher ----------------------------------------------------

/// A training batch in wire form (the layout of REFERENCE.md, "Training batch layout"): named
/// tensors whose first dimension is the row count B (`sequences [B,S]`, `attention_mask [B,S]`,
/// response tensors `[B,R]`), the response length R, the number of trailing padding rows and
/// the per-row ids (each empty or one per row). In one process a payload travels by reference
/// (CAF shares message contents); across nodes the tensors travel as raw bytes.
struct batch_payload {
  std::map<std::string, tensor_blob> tensors;
  int64_t response_length = 0;
  int64_t pad_size = 0;
  std::vector<int64_t> uids;
  std::vector<int64_t> group_ids;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, batch_payload& x) {
  return f(caf::meta::type_name("batch_payload"), x.tensors, x.response_length, x.pad_size, x.uids,
           x.group_ids);
}

inline bool operator==(const batch_payload& a, const batch_payload& b) {
  return a.tensors == b.tensors && a.response_length == b.response_length &&
         a.pad_size == b.pad_size && a.uids == b.uids && a.group_ids == b.group_ids;
}

/// Which loss a `forward_backward` computes: a registry name (`cross_entropy`, `regular`,
/// `ppo_critic`, ...) with its numeric settings and string options.
struct loss_request {
  std::string loss_fn;
  std::map<std::string, double> values;
  std::map<std::string, std::string> options;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, loss_request& x) {
  return f(caf::meta::type_name("loss_request"), x.loss_fn, x.values, x.options);
}

inline bool operator==(const loss_request& a, const loss_request& b) {
  return a.loss_fn == b.loss_fn && a.values == b.values && a.options == b.options;
}

/// Per-row outputs of `forward` / `forward_backward` (tensors `[B, R]`, one row per input row,
/// in input order) and metrics named `name:reduction`. `tokens` is the weight the `:mean` metrics
/// were computed over (it weighs them when results are combined): the loss's metric weight
/// (backends/algo/losses.hpp) for a pass with a loss, the loss-mask weight without.
struct batch_result {
  std::map<std::string, tensor_blob> outputs;
  std::map<std::string, double> metrics;
  double tokens = 0;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, batch_result& x) {
  return f(caf::meta::type_name("batch_result"), x.outputs, x.metrics, x.tokens);
}

inline bool operator==(const batch_result& a, const batch_result& b) {
  return a.outputs == b.outputs && a.metrics == b.metrics && a.tokens == b.tokens;
}

} // namespace rlforge

namespace rlforge::tinker {

/// The `optim_step` message's AdamW hyper-parameters: tinker::adam_params itself (the one struct
/// of them; a negative learning_rate means the worker's own rate), on the wire as
/// "adam_params". Declared here, beside it, so that CAF finds it by argument lookup.
template <class Inspector> typename Inspector::result_type inspect(Inspector& f, adam_params& x) {
  return f(caf::meta::type_name("adam_params"), x.learning_rate, x.beta1, x.beta2, x.eps,
           x.weight_decay, x.grad_clip_norm);
}

/// A Tinker tensor on the wire: its dtype as a code, checked when it is read back.
template <class Inspector> typename Inspector::result_type inspect(Inspector& f, tensor_data& x) {
  auto code = static_cast<uint8_t>(x.type);
  auto store_code = [&]() -> caf::error {
    if (code > static_cast<uint8_t>(dtype::bfloat16))
      return rlforge::make_error(errc::decode_error,
                                 "tensor_data: dtype code " + std::to_string(code) + " is unknown");
    x.type = static_cast<dtype>(code);
    return caf::none;
  };
  return f(caf::meta::type_name("tensor_data"), code, caf::meta::load_callback(store_code), x.shape,
           x.floats, x.ints);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, datum& x) {
  return f(caf::meta::type_name("datum"), x.tokens, x.loss_fn_inputs);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, resolved_loss& x) {
  return f(caf::meta::type_name("resolved_loss"), x.tinker_name, x.name, x.values, x.options,
           x.required_inputs);
}

/// A checked Tinker training request on the wire (the friend that tinker/datum_check.hpp
/// declares): only rlforge processes send one, each having built it with `check_request`.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checked_request& x) {
  return f(caf::meta::type_name("checked_request"), x.model_id_, x.data_, x.loss_, x.forward_only_);
}

} // namespace rlforge::tinker

namespace rlforge {

/// What a worker computed for a `tinker::checked_request` (or the slice of its datums one rank
/// holds): per datum, in order, its outputs as Tinker tensors (`logprobs` for a policy or
/// `values` for a critic, and `elementwise_loss`, float32 of the datum's length); the loss's
/// metrics `name:reduction` (with `loss:sum`, the sum of the elementwise losses); and `tokens`,
/// the weight of the `:mean` metrics when parts are combined (as `batch_result::tokens`).
struct tinker_pass_result {
  std::vector<std::map<std::string, tinker::tensor_data>> datum_outputs;
  std::map<std::string, double> metrics;
  double tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tinker_pass_result& x) {
  return f(caf::meta::type_name("tinker_pass_result"), x.datum_outputs, x.metrics, x.tokens);
}

inline bool operator==(const tinker_pass_result& a, const tinker_pass_result& b) {
  return a.datum_outputs == b.datum_outputs && a.metrics == b.metrics && a.tokens == b.tokens;
}

/// What one optimizer step did: the global gradient norm before clipping (after the
/// data-parallel all-reduce), whether the step was skipped (non-finite norm: nothing changed) or
/// clipped, the learning rate used and the number of steps applied so far.
struct optim_result {
  double grad_norm = 0;
  bool skipped = false;
  bool clipped = false;
  double learning_rate = 0;
  int64_t step = 0;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, optim_result& x) {
  return f(caf::meta::type_name("optim_result"), x.grad_norm, x.skipped, x.clipped, x.learning_rate,
           x.step);
}

inline bool operator==(const optim_result& a, const optim_result& b) {
  return a.grad_norm == b.grad_norm && a.skipped == b.skipped && a.clipped == b.clipped &&
         a.learning_rate == b.learning_rate && a.step == b.step;
}

/// How a worker builds its model and optimizer. Exactly one of `hf_dir` (a Hugging Face
/// directory), `preset` (a named config such as "tiny") and `config_json` (an HF config.json
/// object as text, randomly initialised) is set. Random weights are drawn from `seed`, so every
/// rank of a group starts identical. `lora_rank` > 0 adds adapters (and freezes the base); the
/// learning-rate schedule is used by `optim_step` requests with a negative learning rate.
/// `untie_word_embeddings` gives a tied lm_head its own copy of the embedding (an engine that
/// receives the merged weights of a model whose unembedding was adapted).
struct model_spec {
  std::string hf_dir;
  std::string preset;
  std::string config_json;
  uint64_t seed = 0;
  int64_t lora_rank = 0;
  double lora_alpha = 16.0;
  std::vector<std::string> lora_target_modules; ///< empty = all seven projections
  double lora_dropout = 0.0;
  std::string lr_schedule = "constant"; ///< constant | constant_with_warmup | cosine
  double learning_rate = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr_ratio = 0.0;
  bool untie_word_embeddings = false;
  /// Precision of the model's matrix products: "fp32", "bf16" (mixed precision: fp32 master
  /// weights, bf16 GEMMs; engines store their weights in bf16), or "" = the rank's node default
  /// (bf16 where the hardware has fast bf16 GEMMs, `rlforge info` says which).
  std::string compute_dtype;
  /// Batch-invariant numerics (backends/model/causal_lm.hpp `set_batch_invariant`): a token's
  /// log-prob is the same bit for bit whatever its batch-mates, in engines and trainers alike.
  bool batch_invariant = false;
  /// Engines: the directory whose tokenizer decodes generated tokens for stop strings (e.g. the
  /// base model of an exported checkpoint, which has none of its own); it must hold one. Empty:
  /// `hf_dir`'s tokenizer when it has one. Trainers do not use it.
  std::string tokenizer_dir;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, model_spec& x) {
  return f(caf::meta::type_name("model_spec"), x.hf_dir, x.preset, x.config_json, x.seed,
           x.lora_rank, x.lora_alpha, x.lora_target_modules, x.lora_dropout, x.lr_schedule,
           x.learning_rate, x.warmup_steps, x.total_steps, x.min_lr_ratio, x.untie_word_embeddings,
           x.compute_dtype, x.batch_invariant, x.tokenizer_dir);
}

inline bool operator==(const model_spec& a, const model_spec& b) {
  return a.hf_dir == b.hf_dir && a.preset == b.preset && a.config_json == b.config_json &&
         a.seed == b.seed && a.lora_rank == b.lora_rank && a.lora_alpha == b.lora_alpha &&
         a.lora_target_modules == b.lora_target_modules && a.lora_dropout == b.lora_dropout &&
         a.lr_schedule == b.lr_schedule && a.learning_rate == b.learning_rate &&
         a.warmup_steps == b.warmup_steps && a.total_steps == b.total_steps &&
         a.min_lr_ratio == b.min_lr_ratio && a.untie_word_embeddings == b.untie_word_embeddings &&
         a.compute_dtype == b.compute_dtype && a.batch_invariant == b.batch_invariant &&
         a.tokenizer_dir == b.tokenizer_dir;
}

/// Settings of a worker's passes that are not part of one loss: micro-batching (rows per
/// micro-batch, 0 = the whole shard at once; or, with `max_tokens_per_micro_batch` > 0,
/// padding-free micro-batches of rows sorted by length within that many tokens, as veRL's dynamic
/// batch size: backends/train/micro_batches.hpp; gradients accumulate over micro-batches and the
/// losses do not depend on the split), activation checkpointing, the sampling temperature
/// log-probs are computed at, the log-prob chunk size, and the optional KL-to-reference loss and
/// entropy bonus of a policy (REFERENCE.md; means over the rank's shard).
struct algorithm_config {
  int64_t micro_batch_size = 0;
  int64_t max_tokens_per_micro_batch = 0;
  /// Recompute each decoder layer's activations in backward instead of keeping them (less
  /// memory, about one more forward pass of compute).
  bool gradient_checkpointing = false;
  double temperature = 1.0;
  int64_t logprob_chunk_size = 128;
  bool use_kl_loss = false;
  std::string kl_estimator = "k3";
  double kl_loss_coef = 0.001;
  bool use_entropy_loss = false;
  double entropy_loss_coef = 0.01;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, algorithm_config& x) {
  return f(caf::meta::type_name("algorithm_config"), x.micro_batch_size,
           x.max_tokens_per_micro_batch, x.gradient_checkpointing, x.temperature,
           x.logprob_chunk_size, x.use_kl_loss, x.kl_estimator, x.kl_loss_coef, x.use_entropy_loss,
           x.entropy_loss_coef);
}

inline bool operator==(const algorithm_config& a, const algorithm_config& b) {
  return a.micro_batch_size == b.micro_batch_size &&
         a.max_tokens_per_micro_batch == b.max_tokens_per_micro_batch &&
         a.gradient_checkpointing == b.gradient_checkpointing && a.temperature == b.temperature &&
         a.logprob_chunk_size == b.logprob_chunk_size && a.use_kl_loss == b.use_kl_loss &&
         a.kl_estimator == b.kl_estimator && a.kl_loss_coef == b.kl_loss_coef &&
         a.use_entropy_loss == b.use_entropy_loss && a.entropy_loss_coef == b.entropy_loss_coef;
}

// -- inference engines -------------------------------------------------------------------------

/// Named tensors in wire form (e.g. a full set of model weights for an engine's `set_weights`).
using tensor_map = std::map<std::string, tensor_blob>;

/// One generation request for an inference engine (backends sampling semantics, REFERENCE.md
/// "Sampling"). `num_samples` > 1 expands the request into that many rows: samples
/// `first_sample .. first_sample + num_samples - 1` of the caller's request (a large request may
/// be sent in slices). With a seed, sample j draws from the stream `sample_seed(seed, j)`
/// (backends/model/sampling_params.hpp), so distinct seeds and distinct samples give unrelated
/// streams and a sample's tokens do not depend on how the request was sliced or batched.
/// `weight_version` 0 runs on the engine's current weights; v > 0 on the weights it held as
/// version v (current, or a retained snapshot), refused when it holds neither.
struct sample_request {
  std::vector<int64_t> prompt;
  int64_t max_tokens = 16;
  double temperature = 1.0;
  int64_t top_k = -1; ///< -1 = off
  double top_p = 1.0; ///< 1 = off
  bool has_seed = false;
  uint64_t seed = 0; ///< used when `has_seed`
  std::vector<int64_t> stop_token_ids;
  /// Non-empty strings: a row stops with the token after which its decoded text contains one
  /// (backends/model/stop_strings.hpp); needs an engine whose model has a tokenizer.
  std::vector<std::string> stop_strings;
  bool prompt_logprobs = false;
  int64_t topk_prompt_logprobs = 0; ///< > 0: the k most likely tokens at each prompt position
  int64_t num_samples = 1;
  int64_t first_sample = 0;
  int64_t weight_version = 0;
  /// A continuation: the tokens the request's one sample (num_samples must be 1) already
  /// generated in an earlier call. They are re-fed and count towards max_tokens, and a seeded
  /// sample skips the draws they took, so the call generates what the uninterrupted run would
  /// have next. Empty: a fresh start.
  std::vector<int64_t> generated;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample_request& x) {
  return f(caf::meta::type_name("sample_request"), x.prompt, x.max_tokens, x.temperature, x.top_k,
           x.top_p, x.has_seed, x.seed, x.stop_token_ids, x.stop_strings, x.prompt_logprobs,
           x.topk_prompt_logprobs, x.num_samples, x.first_sample, x.weight_version, x.generated);
}

inline bool operator==(const sample_request& a, const sample_request& b) {
  return a.prompt == b.prompt && a.max_tokens == b.max_tokens && a.temperature == b.temperature &&
         a.top_k == b.top_k && a.top_p == b.top_p && a.has_seed == b.has_seed && a.seed == b.seed &&
         a.stop_token_ids == b.stop_token_ids && a.stop_strings == b.stop_strings &&
         a.prompt_logprobs == b.prompt_logprobs &&
         a.topk_prompt_logprobs == b.topk_prompt_logprobs && a.num_samples == b.num_samples && a.first_sample == b.first_sample &&
         a.weight_version == b.weight_version && a.generated == b.generated;
}

/// What one generated row produced: tokens, their log-probabilities, "stop", "length" or
/// "abort" (a request stopped before it finished: `pause(abort)`, `cancel`, a deadline), the
/// prompt's log-probabilities when asked (n-1 entries for n prompt tokens), and for each token
/// the weights version that produced it (an engine that took new weights mid-request tags the
/// tokens after the update with the new version).
struct sample_output {
  std::vector<int64_t> tokens;
  std::vector<double> logprobs;
  std::string stop_reason;
  std::vector<double> prompt_logprobs;
  std::vector<int64_t> token_versions;
  /// (n-1) x k row-major when topk_prompt_logprobs = k (backends::sample_result says how).
  std::vector<int64_t> topk_prompt_ids;
  std::vector<double> topk_prompt_logprobs;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, sample_output& x) {
  return f(caf::meta::type_name("sample_output"), x.tokens, x.logprobs, x.stop_reason,
           x.prompt_logprobs, x.token_versions, x.topk_prompt_ids, x.topk_prompt_logprobs);
}

inline bool operator==(const sample_output& a, const sample_output& b) {
  return a.tokens == b.tokens && a.logprobs == b.logprobs && a.stop_reason == b.stop_reason &&
         a.prompt_logprobs == b.prompt_logprobs && a.token_versions == b.token_versions &&
         a.topk_prompt_ids == b.topk_prompt_ids &&
         a.topk_prompt_logprobs == b.topk_prompt_logprobs;
}

/// One request of a streaming submission (engine and dispatcher op `submit`), delivered to the
/// submitter's consumer actor as soon as it is done: its `num_samples` rows, or, when it failed
/// or was stopped, what it generated so far (unfinished rows with stop_reason "abort") and why
/// in `error` (empty for a request stopped by `pause(abort)` or `cancel`; `timeout` when its
/// deadline passed; `rank_failed` when its engine died: nothing came back, requeue it).
/// `engine_rank` is the rank of the engine group that ran it.
struct generation_result {
  int64_t id = 0;
  std::vector<sample_output> samples;
  std::string error;
  int32_t error_code = 0; ///< the `rlforge::errc` value of `error` (0 = none)
  int32_t engine_rank = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_result& x) {
  return f(caf::meta::type_name("generation_result"), x.id, x.samples, x.error, x.error_code,
           x.engine_rank);
}

inline bool operator==(const generation_result& a, const generation_result& b) {
  return a.id == b.id && a.samples == b.samples && a.error == b.error &&
         a.error_code == b.error_code && a.engine_rank == b.engine_rank;
}

/// Settings of an inference engine's continuous batching (engine op `configure`; see
/// backends::engine_config): the KV-cache memory budget in bytes, positions per block, the most
/// sequences decoded together, the most tokens per forward pass, and prefix caching across
/// requests.
struct engine_options {
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int64_t block_size = 16;
  int64_t max_num_seqs = 256;
  int64_t max_step_tokens = 2048;
  bool prefix_caching = true;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_options& x) {
  return f(caf::meta::type_name("engine_options"), x.kv_cache_bytes, x.block_size,
           x.max_num_seqs, x.max_step_tokens, x.prefix_caching);
}

inline bool operator==(const engine_options& a, const engine_options& b) {
  return a.kv_cache_bytes == b.kv_cache_bytes && a.block_size == b.block_size &&
         a.max_num_seqs == b.max_num_seqs && a.max_step_tokens == b.max_step_tokens &&
         a.prefix_caching == b.prefix_caching;
}

/// One weight transfer from a trainer's rank 0 to one inference engine (or, for `gloo`, to every
/// engine at once), as the dispatcher plans it (actors/weight_sync.hpp).
struct weight_sync_spec {
  /// "in_process" (same process), "shm" (same host), "gloo" (any host), "message" (the
  /// weights travel as a `tensor_map` in CAF messages through the dispatcher).
  std::string transport;
  /// Names the meeting point both ends use: the in-process channel or the socket of the shm
  /// link, unique per transfer; for gloo, the persistent channel (a Gloo group between the
  /// sender and its receivers, kept by both ends and reused by every transfer that names it).
  std::string channel;
  int64_t version = 0;      ///< the version the engines hold afterwards (>= 1)
  /// Bucket size; 0 = the transport's choice: 256 MiB, or for gloo the bucket the channel's
  /// measured link suggests (backends::bucket_bytes_for_link; 4 MiB before it was measured).
  int64_t bucket_bytes = 0;
  int64_t timeout_ms = 0;   ///< bound on every wait for the peer (> 0)
  /// gloo: where the channel's ranks rendezvous when they open it (its first transfer).
  rendezvous_store_actor store;
  int32_t world_size = 2;   ///< gloo: 1 sender + the receivers
  int32_t rank = 0;         ///< gloo: this end's rank (0 = the sender)
  /// gloo, read by the sender (rank 0): send only the elements that changed since the version
  /// the receivers hold, when that is smaller (backends/weights/gloo_transport.hpp); the
  /// receivers take whatever comes. Refused with the other transports.
  bool delta = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, weight_sync_spec& x) {
  return f(caf::meta::type_name("weight_sync_spec"), x.transport, x.channel, x.version,
           x.bucket_bytes, x.timeout_ms, x.store, x.world_size, x.rank, x.delta);
}

inline bool operator==(const weight_sync_spec& a, const weight_sync_spec& b) {
  return a.transport == b.transport && a.channel == b.channel && a.version == b.version &&
         a.bucket_bytes == b.bucket_bytes && a.timeout_ms == b.timeout_ms &&
         a.store == b.store &&
         a.world_size == b.world_size && a.rank == b.rank && a.delta == b.delta;
}

/// One prompt group of an RL loop (rl/): the request the rollout producer submits for it and,
/// once generated, its `num_samples` rows with their per-token weight versions. `id` is the
/// loop's, unique over a run. `submissions` counts how often it went to the engines (a request
/// lost with a dead engine or handed back by `pause(abort)` is submitted again from scratch).
struct rollout {
  int64_t id = 0;
  sample_request request;
  std::vector<sample_output> samples;
  int64_t submissions = 0;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, rollout& x) {
  return f(caf::meta::type_name("rollout"), x.id, x.request, x.samples, x.submissions);
}

inline bool operator==(const rollout& a, const rollout& b) {
  return a.id == b.id && a.request == b.request && a.samples == b.samples &&
         a.submissions == b.submissions;
}

/// What a trainer takes from the rollout producer: complete rollouts in ascending id with each
/// one's staleness (the trainer's weight version minus the oldest version among its tokens),
/// and what the producer did since the previous take: the ids it dropped as staler than the
/// bound and the number of requeued submissions.
struct rollout_batch {
  std::vector<rollout> rollouts;
  std::vector<int64_t> staleness;
  std::vector<int64_t> dropped_ids;
  int64_t requeued = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_batch& x) {
  return f(caf::meta::type_name("rollout_batch"), x.rollouts, x.staleness, x.dropped_ids,
           x.requeued);
}

inline bool operator==(const rollout_batch& a, const rollout_batch& b) {
  return a.rollouts == b.rollouts && a.staleness == b.staleness &&
         a.dropped_ids == b.dropped_ids && a.requeued == b.requeued;
}

/// Everything a rollout producer holds, for a checkpoint: rollouts not generated yet (queued or
/// in flight; their partial rows are not kept, they are generated again after a restore),
/// complete ones not yet taken, and the accounting (taken, dropped and requeued counts, and the
/// staleness histogram of taken rollouts: `staleness_counts[s]` rollouts had staleness s).
struct rollout_state {
  std::vector<rollout> waiting;
  std::vector<rollout> done;
  int64_t taken = 0;
  int64_t dropped = 0;
  int64_t requeued = 0;
  std::vector<int64_t> staleness_counts;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_state& x) {
  return f(caf::meta::type_name("rollout_state"), x.waiting, x.done, x.taken, x.dropped,
           x.requeued, x.staleness_counts);
}

inline bool operator==(const rollout_state& a, const rollout_state& b) {
  return a.waiting == b.waiting && a.done == b.done && a.taken == b.taken &&
         a.dropped == b.dropped && a.requeued == b.requeued &&
         a.staleness_counts == b.staleness_counts;
}

} // namespace rlforge
