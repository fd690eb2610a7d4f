#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "service/wire/limits.hpp"
#include "tinker/types.hpp"

/// `forward_backward` / `forward` bodies of the Tinker API (TINKER-WIRE.md): the protobuf form of
/// service/tinker.proto (optionally zstd compressed) and the JSON form of older SDKs, decoded into
/// the plain structs of tinker/types.hpp, and the results encoded back. Decoders check syntax
/// completely before they return (a bad body throws `tinker::request_error` ("user") whose
/// message starts with the endpoint and names the field, datum, chunk or element); encoders throw
/// `request_error` ("server") when a result breaks the wire contract (a backend bug).
/// Reentrant.
namespace rlforge::service {

/// Decodes a protobuf `ForwardBackwardRequest` (already decompressed). Chunks of a datum are
/// concatenated; EncodedText tokens are little-endian int32; Tensor `dense` bytes and
/// `sparse_csr` (2-D, decoded to dense) become `tensor_data` (an empty shape means 1-D of the
/// data's length). Then `normalize_loss_inputs` and `validate_forward_backward` run.
/// Refused: bytes that do not parse, image/dmel chunks, an empty chunk, token bytes not a multiple
/// of 4, DTYPE_UNSPECIFIED or unknown dtypes, dense bytes not a multiple of the element size or
/// disagreeing with the shape, a tensor with neither encoding, inconsistent CSR indices, and
/// what `validate_forward_backward` refuses.
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

/// Converts integer-typed inputs other than `target_tokens` (e.g. `weights` sent as int64) to
/// float32 in place (rounded to float32 precision), the dtype the backend expects.
void normalize_loss_inputs(tinker::datum& d);

/// The syntax checks of a decoded request (what a model accepts is the backend's to check, once:
/// tinker/datum_check.hpp): throws `request_error` ("user") for an empty model_id or loss_fn, a
/// negative seq_id, a datum whose loss input's data disagrees with its shape. Token ids, lengths,
/// input names, dtypes per input, values and the loss and its config are not checked here.
void validate_forward_backward(const tinker::forward_backward_request& request);

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

/// Throws `request_error` ("server") unless `name` is "<metric>:<reduction>" with exactly one
/// colon, a non-empty metric and a reduction the SDK knows (mean, sum, min, max, slack,
/// hash_unordered, unique): the SDK fails or silently drops anything else.
void validate_metric_name(const std::string& name);

} // namespace rlforge::service
