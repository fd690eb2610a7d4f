#include "service/wire/compression.hpp"

#include <algorithm>
#include <memory>

#include <zstd.h>

#include "service/wire/codec_support.hpp"

namespace rlforge::service {

using namespace wire_detail;

std::string zstd_decompress(std::string_view compressed, size_t max_output_bytes) {
  if (compressed.empty())
    user_error("zstd: empty body is not a zstd frame");
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx)
    server_error("zstd: cannot allocate a decompression context");
  // Encoders shrink a frame's window to its content size, so a window beyond twice the largest
  // allowed output only makes the decoder reserve memory for nothing: refuse such frames.
  int window_log = 10;
  while (window_log < 27 && (size_t{1} << window_log) / 2 < max_output_bytes)
    ++window_log;
  ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax, window_log);
  std::string out;
  std::string buffer(ZSTD_DStreamOutSize(), '\0');
  ZSTD_inBuffer in{compressed.data(), compressed.size(), 0};
  for (;;) {
    const size_t consumed = in.pos;
    ZSTD_outBuffer ob{buffer.data(), buffer.size(), 0};
    const size_t ret = ZSTD_decompressStream(ctx.get(), &ob, &in);
    if (ZSTD_isError(ret))
      user_error(std::string("zstd: corrupt or unsupported data: ") + ZSTD_getErrorName(ret));
    if (ob.pos > max_output_bytes - std::min(out.size(), max_output_bytes))
      user_error("zstd: decompressed body exceeds the limit of " +
                 std::to_string(max_output_bytes) + " bytes");
    out.append(buffer.data(), ob.pos);
    if (ret == 0 && in.pos == in.size)
      return out; // the last frame is complete and flushed
    // The decoder wants more input than there is: the frame was cut short.
    if (in.pos == in.size && in.pos == consumed && ob.pos == 0)
      user_error("zstd: truncated frame (" + std::to_string(compressed.size()) + " bytes)");
  }
}

std::string zstd_compress(std::string_view data, int level) {
  if (level < 1 || level > 19)
    server_error("zstd: compression level " + std::to_string(level) + " is outside 1..19");
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), level);
  if (ZSTD_isError(n))
    server_error(std::string("zstd: compression failed: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

std::string decode_content(std::string_view body, std::string_view content_encoding,
                           size_t max_output_bytes) {
  const auto enc = lower_trim(content_encoding);
  if (enc == "zstd")
    return zstd_decompress(body, max_output_bytes);
  if (!enc.empty() && enc != "identity")
    user_error("unsupported Content-Encoding \"" + std::string(content_encoding) +
               "\" (accepted: identity, zstd)");
  if (body.size() > max_output_bytes)
    user_error("body of " + std::to_string(body.size()) + " bytes exceeds the limit of " +
               std::to_string(max_output_bytes) + " bytes");
  return std::string(body);
}

} // namespace rlforge::service
