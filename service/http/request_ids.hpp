#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace rlforge::service::http {

/// The (model_id, seq_id) of an ordered request's body, read leniently so that a request refused
/// because its body does not decode still gives up its seq_id: a JSON body is read with the
/// non-JSON literals the SDK may emit (bare `NaN`, `Infinity`, `-Infinity`) taken as null; a
/// protobuf body (after undoing `Content-Encoding: zstd`, at most `max_bytes`) is scanned field by
/// field up to the first corrupt one. Returns {"", -1} when either id cannot be found (an id of
/// the wrong type counts as missing). Never throws. Reentrant.
std::pair<std::string, int64_t> ordered_request_ids(std::string_view content_type,
                                                    std::string_view content_encoding,
                                                    std::string_view body, size_t max_bytes);

} // namespace rlforge::service::http
