#pragma once

#include <string>
#include <string_view>

#include "service/wire/limits.hpp"
#include "tinker/types.hpp"

/// `asample` bodies of the Tinker API (TINKER-WIRE.md) and the `SampleResponse` results, in
/// protobuf and JSON. Decoding throws `tinker::request_error` ("user") naming the field; encoding
/// throws `request_error` ("server") for a result that breaks the wire contract. Reentrant.
namespace rlforge::service {

/// An `asample` body: the contract request plus the older addressing by path or base model.
struct sample_body {
  tinker::sample_request request;
  std::string model_path; ///< "tinker://..." (older SDKs), empty when absent
  std::string base_model; ///< empty when absent
};

/// Decodes `asample` JSON: `{num_samples?, prompt: {chunks}, sampling_params: {max_tokens, seed?,
/// stop?: str | [str] | [int], temperature?, top_k?, top_p?}, sampling_session_id?, seq_id?,
/// model_path?, base_model?, prompt_logprobs?, topk_prompt_logprobs?}`. Syntax only (the values
/// are the backend's to check, tinker/datum_check.hpp): refused are a body that is not a JSON
/// object, fields of the wrong JSON type, no sampling_session_id, model_path or base_model; a
/// sampling_session_id without seq_id; a negative seq_id; a model_path not starting with
/// "tinker://"; a non-text chunk; max_tokens absent; a stop list mixing strings and token ids.
/// `top_k` 0 means off and is stored as -1.
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

} // namespace rlforge::service
