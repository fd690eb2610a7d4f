#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tinker_types.hpp"

/// The bodies of the Tinker HTTP API (docs: TINKER-WIRE.md of the issue, REFERENCE.md
/// "Tinker-compatible API") decoded into and encoded from the plain structs of
/// runtime/tinker_types.hpp: the protobuf forms of service/tinker.proto (optionally zstd
/// compressed) and the JSON forms of every SDK version.
///
/// Every decoder validates completely before it returns: a bad body throws
/// `tinker::request_error` with category "user" whose message starts with the endpoint and names
/// the field (with the datum / chunk / element index where there is one) and what was wrong;
/// nothing is half-decoded. Encoders throw `request_error` with category "server" when a result
/// breaks the wire contract (a backend bug), e.g. a metric name without a reduction.
///
/// JSON decoders follow the SDK's pydantic dumps: `null` is the same as an absent field, unknown
/// fields are ignored (newer SDKs add some), integer fields must be JSON integers, number fields
/// accept integers, and a `"type"` discriminator, when present, must name the endpoint.
///
/// Thread safety: every function is reentrant (no shared state).
namespace rlforge::service {

/// Limits applied while decoding. The model-dependent ones are unchecked when 0.
struct wire_limits {
  /// Largest body accepted after decompression; also the zstd output limit.
  size_t max_body_bytes = size_t{512} << 20;
  /// Token ids must be < vocab_size (0 = unchecked).
  int64_t vocab_size = 0;
  /// A datum's model input and a sampling prompt must be shorter than this (0 = unchecked).
  int64_t max_context_length = 0;
};

// ---- compression -----------------------------------------------------------------------------

/// Decompresses one or more concatenated zstd frames. Throws `request_error` ("user") for data
/// that is not zstd, a truncated or corrupt frame, or output larger than `max_output_bytes`
/// (stopping as soon as the limit is passed, so a decompression bomb costs at most that much), or
/// a frame whose window exceeds twice `max_output_bytes` (capped at 2^27, zstd's default).
std::string zstd_decompress(std::string_view compressed, size_t max_output_bytes);

/// Compresses `data` into one zstd frame at `level` (1..19). Throws `request_error` ("server")
/// for a level out of range.
std::string zstd_compress(std::string_view data, int level = 3);

/// Undoes a `Content-Encoding` header: empty or "identity" returns the body as is, "zstd"
/// decompresses (at most `max_output_bytes`). Anything else (gzip, br, a list) throws
/// `request_error` ("user") naming the encoding. Case-insensitive, surrounding spaces ignored.
std::string decode_content(std::string_view body, std::string_view content_encoding,
                           size_t max_output_bytes);

// ---- forward_backward ------------------------------------------------------------------------

/// Decodes a protobuf `ForwardBackwardRequest` (already decompressed). Chunks of a datum are
/// concatenated; EncodedText tokens are little-endian int32; Tensor `dense` bytes and
/// `sparse_csr` (2-D, decoded to dense) become `tensor_data` (an empty shape means 1-D of the
/// data's length). Then `normalize_loss_inputs` and `validate_forward_backward` run.
/// Refused: bytes that do not parse, image/dmel chunks, an empty chunk, token bytes not a multiple
/// of 4, DTYPE_UNSPECIFIED or unknown dtypes, dense bytes not a multiple of the element size or
/// disagreeing with the shape, a tensor with neither encoding, inconsistent CSR indices, and
/// everything `validate_forward_backward` refuses.
tinker::forward_backward_request decode_forward_backward_proto(std::string_view body,
                                                               const wire_limits& limits = {});

/// Decodes the JSON body of `forward_backward` (key "forward_backward_input") or of the older
/// `forward` endpoint (key "forward_input", which sets `forward_only`): `{model_id, seq_id,
/// forward_backward_input: {data: [{model_input: {chunks: [{type: "encoded_text", tokens}]},
/// loss_fn_inputs: {name: {data, dtype, shape, sparse_crow_indices?, sparse_col_indices?}}}],
/// loss_fn, loss_fn_config?}}`. A `forward_only` boolean at the top level is honoured too. Same
/// checks as the protobuf decoder, plus JSON types (an int64 tensor's data must be integers) and
/// float ranges: float values are rounded to their dtype's precision (float32 / bfloat16), and a
/// value outside the float32 range is refused.
tinker::forward_backward_request decode_forward_backward_json(std::string_view body,
                                                              const wire_limits& limits = {});

/// What the HTTP layer calls: undoes `content_encoding` (see `decode_content`, limited by
/// `limits.max_body_bytes`), then decodes protobuf when `content_type` is
/// "application/x-protobuf" (parameters after ';' ignored) and JSON when it is
/// "application/json" or empty. Any other content type is refused, naming it.
tinker::forward_backward_request decode_forward_backward(std::string_view body,
                                                         std::string_view content_type,
                                                         std::string_view content_encoding,
                                                         const wire_limits& limits = {});

/// Decodes one serialized protobuf `Tensor` message as `decode_forward_backward_proto` does for
/// each loss input (dense or sparse_csr, dtype and shape checks; no per-token checks). `where`
/// starts the error messages. Public for tests and tools.
tinker::tensor_data decode_tensor_proto(std::string_view tensor_message, const std::string& where,
                                        const wire_limits& limits = {});

/// Names of the loss inputs the service accepts: target_tokens, weights, logprobs, advantages,
/// values, returns (each a 1-D tensor with one element per model-input token).
const std::vector<std::string>& loss_input_names();

/// Converts integer-typed float inputs (e.g. `weights` sent as int64) to float32 in place, so
/// (rounded to float32 precision) so that `validate_forward_backward` sees the dtypes the backend
/// expects.
void normalize_loss_inputs(tinker::datum& d);

/// Checks a decoded request; throws `request_error` ("user") naming the first problem:
/// empty model_id, negative seq_id, unknown loss or config (`validate_loss_config`), no data, a
/// datum without tokens, a negative token id or one >= `limits.vocab_size`, a model input not
/// shorter than `limits.max_context_length`, an unknown loss input name, a loss input that is not
/// 1-D with one element per token, whose element count disagrees with its shape, whose dtype is
/// wrong (target_tokens int64/int32, the others float32/bfloat16), with a non-finite value, a
/// negative weight, a missing required input (target_tokens always; logprobs and advantages for
/// importance_sampling, cispo, dro, gspo, dppo; for ppo either those or `returns` (a critic);
/// returns for ppo_critic).
void validate_forward_backward(const tinker::forward_backward_request& request,
                               const wire_limits& limits = {});

/// Encodes a request as the protobuf body the SDK sends (tokens as one EncodedText chunk, tensors
/// dense in their dtype). For test clients. Throws `request_error` ("user") for a seq_id outside
/// int32 or a token id outside int32.
std::string encode_forward_backward_request_proto(const tinker::forward_backward_request& request);

/// Encodes a result as a protobuf `ForwardBackwardOutput`: `loss_fn_output_type` as given, ONE
/// `ArrayRecord` (type_tag "ArrayRecord", num_datums = N) with one `BatchedTensor` per output
/// name: the data of every datum concatenated in the name's dtype, `offsets` the N + 1
/// little-endian int64 BYTE offsets [0, b_0, b_0 + b_1, ...], `trailing_shape` = shape[1:]
/// (a 1-D output of length L_i has trailing_shape [] and b_i = L_i * element size). Metrics go
/// to the map as they are. Throws `request_error` ("server") when a metric name is not
/// `name:reduction` (see `validate_metric_name`), datums disagree on output names, dtypes or
/// trailing shapes, or a tensor's data length differs from its shape.
std::string encode_forward_backward_output_proto(const tinker::forward_backward_output& output);

/// Decodes a protobuf `ForwardBackwardOutput` the way the SDK does (every ArrayRecord's fields
/// sliced per datum by the byte offsets; shape [n_i] + trailing_shape). For test clients.
/// Throws `request_error` ("user") for bytes that do not parse or inconsistent offsets.
tinker::forward_backward_output decode_forward_backward_output_proto(std::string_view body);

/// Encodes a result as the JSON older SDKs accept: `{"loss_fn_output_type", "loss_fn_outputs":
/// [{name: {"data", "dtype", "shape"}}], "metrics"}` with dtypes collapsed to "float32" / "int64"
/// (the SDK's public dtypes). Same checks as the protobuf encoder; non-finite values become null.
std::string encode_forward_backward_output_json(const tinker::forward_backward_output& output);

/// Throws `request_error` ("server") unless `name` is "<metric>:<reduction>" with exactly one
/// colon, a non-empty metric and a reduction the SDK knows (mean, sum, min, max, slack,
/// hash_unordered, unique): the SDK fails or silently drops anything else.
void validate_metric_name(const std::string& name);

// ---- losses ----------------------------------------------------------------------------------

/// Names of the losses `forward_backward` accepts: the Tinker losses cross_entropy,
/// importance_sampling, ppo, cispo, dro and rlforge's gspo, dppo and the value loss ppo_critic.
const std::vector<std::string>& loss_names();

/// `loss_fn_config` keys `loss_fn` accepts, sorted (empty for cross_entropy and
/// importance_sampling). Throws `request_error` ("user") for an unknown loss, listing the names.
std::vector<std::string> loss_config_keys(const std::string& loss_fn);

/// Checks a Tinker `loss_fn` and its `loss_fn_config` with the semantics of the backend's
/// `tinker_to_loss_config` (backends/algo/losses.hpp): ppo / gspo / cispo take
/// `clip_low_threshold` ∈ [0, 1] and `clip_high_threshold` (finite, >= 1); ppo also `value_clip`
/// (used when the model is a critic); dro needs `beta` (finite, >= 0); dppo takes `delta_low`,
/// `delta_high` (finite, >= 0); ppo_critic `value_clip` (>= 0, inf = no clipping). Throws
/// `request_error` ("user") for an unknown loss (listing the names), an unknown key (naming it and
/// listing the allowed ones), a NaN or out-of-domain value (naming key and value) and a missing
/// `beta` for dro.
void validate_loss_config(const std::string& loss_fn, const std::map<std::string, double>& config);

/// Maps a Tinker `ppo` config onto rlforge's `regular` policy loss: `eps_clip_low` =
/// 1 - clip_low_threshold and `eps_clip_high` = clip_high_threshold - 1, with Tinker's defaults
/// 0.8 / 1.2 for absent keys (so both keys are always set; `value_clip` is ignored). Validates
/// like `validate_loss_config("ppo", config)` first.
std::map<std::string, double> ppo_to_regular(const std::map<std::string, double>& config);

// ---- sampling --------------------------------------------------------------------------------

/// An `asample` body: the contract request plus the older addressing by path or base model.
struct sample_body {
  tinker::sample_request request;
  std::string model_path; ///< "tinker://..." (older SDKs), empty when absent
  std::string base_model; ///< empty when absent
};

/// Decodes `asample` JSON: `{num_samples?, prompt: {chunks}, sampling_params: {max_tokens, seed?,
/// stop?: str | [str] | [int], temperature?, top_k?, top_p?}, sampling_session_id?, seq_id?,
/// model_path?, base_model?, prompt_logprobs?, topk_prompt_logprobs?}`. Refused: no
/// sampling_session_id, model_path or base_model; a sampling_session_id without seq_id; a
/// model_path not starting with "tinker://"; an empty prompt or non-text chunk; token ids as for
/// forward_backward (and a prompt not shorter than max_context_length); num_samples < 1;
/// max_tokens absent or < 1; temperature not finite or < 0; top_p outside (0, 1]; top_k other than
/// -1, 0 (= off, stored as -1) or >= 1; negative stop tokens or a stop list mixing types;
/// topk_prompt_logprobs < 0, or > 0 (top-k prompt log-probs are not supported).
sample_body decode_sample(std::string_view body, const wire_limits& limits = {});

/// Encodes a sample result as a protobuf `SampleResponse`: per sequence stop_reason, tokens as
/// int32 bytes, logprobs as float32 bytes (always present); `prompt_logprobs` as float32 bytes
/// with NaN forced at position 0 when `has_prompt_logprobs`. Throws `request_error` ("server")
/// for a stop_reason other than "stop"/"length", logprobs whose length differs from the tokens',
/// or a token id outside int32.
std::string encode_sample_response_proto(const tinker::sample_response& response);

/// Decodes a protobuf `SampleResponse` (test clients). Throws `request_error` ("user") for bytes
/// that do not parse or byte lengths that are not whole elements.
tinker::sample_response decode_sample_response_proto(std::string_view body);

/// Encodes a sample result as the JSON older SDKs accept: `{"sequences": [{"stop_reason",
/// "tokens", "logprobs"}], "prompt_logprobs": [null, ...] (when present), "type": "sample"}`.
/// Same checks as the protobuf encoder.
std::string encode_sample_response_json(const tinker::sample_response& response);

// ---- the other JSON bodies -------------------------------------------------------------------

/// `create_session`: `{tags, user_metadata, sdk_version, project_id?}`.
struct create_session_request {
  std::vector<std::string> tags;
  std::map<std::string, std::string> user_metadata; ///< non-string values as their JSON text
  std::string sdk_version;
  std::string project_id;
};

/// `session_heartbeat`: `{session_id}`.
struct session_heartbeat_request {
  std::string session_id;
};

/// `create_model`: `{session_id, model_seq_id, base_model, lora_config?, user_metadata?,
/// model_role?}`; without lora_config the rank is 0.
struct create_model_request {
  std::string session_id;
  int64_t model_seq_id = 0;
  std::string base_model;
  tinker::lora_config lora;
  std::string role = "policy"; ///< "policy" | "critic" (rlforge's `model_role`)
  std::map<std::string, std::string> user_metadata;
};

/// `optim_step`: `{adam_params, model_id, seq_id}`.
struct optim_step_request {
  std::string model_id;
  int64_t seq_id = 0;
  tinker::adam_params adam;
};

/// `save_weights` (`save_state`): `{model_id, seq_id, path?, ttl_seconds?, overwrite?}`.
struct save_weights_request {
  std::string model_id;
  int64_t seq_id = 0;
  std::string path; ///< checkpoint name; empty = the server chooses one
  bool has_ttl = false;
  int64_t ttl_seconds = 0;
  bool overwrite = false;
};

/// `save_weights_for_sampler`: `{model_id, seq_id, path?, sampling_session_seq_id?,
/// ttl_seconds?}`. With a path the weights persist under that name; without, the SDK wants a
/// sampling session (`sampling_session_seq_id`).
struct save_weights_for_sampler_request {
  std::string model_id;
  int64_t seq_id = 0;
  std::string path;
  bool has_sampling_session_seq_id = false;
  int64_t sampling_session_seq_id = 0;
  bool has_ttl = false;
  int64_t ttl_seconds = 0;
};

/// `load_weights`: either legacy addressing `{model_id, seq_id, path, optimizer}` or
/// create-via-load `{session_id, model_seq_id, base_model?, user_metadata?, path, optimizer}`.
struct load_weights_request {
  bool create_via_load = false; ///< true: session_id + model_seq_id address a new model
  std::string model_id;
  int64_t seq_id = 0;
  std::string session_id;
  int64_t model_seq_id = 0;
  std::string base_model;
  std::map<std::string, std::string> user_metadata;
  std::string path; ///< "tinker://..."
  bool optimizer = false;
  std::string weights_access_token;
};

/// `create_sampling_session`: `{session_id, sampling_session_seq_id, model_path?, base_model?}`.
struct create_sampling_session_request {
  std::string session_id;
  int64_t sampling_session_seq_id = 0;
  std::string model_path; ///< "tinker://...", empty = the base model
  std::string base_model;
};

/// `retrieve_future`: `{request_id, allow_metadata_only?}`.
struct retrieve_future_request {
  std::string request_id;
  bool allow_metadata_only = false;
};

/// `weights_info`: `{tinker_path}`.
struct weights_info_request {
  std::string tinker_path;
};

/// `get_info` and `unload_model`: `{model_id}`.
struct model_id_request {
  std::string model_id;
};

/// Decoders of the JSON bodies above. Each throws `request_error` ("user") naming the endpoint
/// and field for malformed JSON, a body that is not an object, a missing required field, a field
/// of the wrong JSON type, a wrong `type` discriminator, or a value out of its domain:
/// negative ids / seq_ids, an empty required string, a lora rank < 0, a model_role other than
/// policy/critic, adam_params that are not finite or out of range (learning_rate >= 0, beta1 and
/// beta2 in [0, 1), eps > 0, weight_decay >= 0, grad_clip_norm >= 0), ttl_seconds < 1, a
/// checkpoint name (`path` of save_weights / save_weights_for_sampler) that is not 1-128 of
/// [A-Za-z0-9._-] or starts with '.', a path / model_path / tinker_path not starting with
/// "tinker://", create_sampling_session with neither model_path nor base_model, and load_weights
/// mixing or lacking both addressing modes.
create_session_request decode_create_session(std::string_view body);
session_heartbeat_request decode_session_heartbeat(std::string_view body);
create_model_request decode_create_model(std::string_view body);
optim_step_request decode_optim_step(std::string_view body);
save_weights_request decode_save_weights(std::string_view body);
save_weights_for_sampler_request decode_save_weights_for_sampler(std::string_view body);
load_weights_request decode_load_weights(std::string_view body);
create_sampling_session_request decode_create_sampling_session(std::string_view body);
retrieve_future_request decode_retrieve_future(std::string_view body);
weights_info_request decode_weights_info(std::string_view body);
model_id_request decode_get_info(std::string_view body);
model_id_request decode_unload_model(std::string_view body);

} // namespace rlforge::service
