#pragma once

#include <cstddef>
#include <string>
#include <string_view>

/// zstd bodies of the Tinker API (`Content-Encoding: zstd`). Throws `tinker::request_error`.
/// Reentrant.
namespace rlforge::service {

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

} // namespace rlforge::service
