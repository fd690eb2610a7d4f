#include "tests/service/wire_test_support.hpp"

#include <zstd.h>

#include "service/wire/compression.hpp"

namespace rlforge::service::test {
namespace {

// -- zstd ---------------------------------------------------------------------------------------

std::string sample_text(size_t n) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i)
    s += "token " + std::to_string(i % 977) + ";";
  s.resize(n);
  return s;
}

TEST(TinkerWireZstd, RoundTripsOneAndSeveralFrames) {
  const auto text = sample_text(300000);
  const auto packed = zstd_compress(text);
  EXPECT_LT(packed.size(), text.size());
  EXPECT_EQ(zstd_decompress(packed, text.size()), text);
  const auto two = zstd_compress("abc", 1) + zstd_compress("def", 19);
  EXPECT_EQ(zstd_decompress(two, 6), "abcdef");
  EXPECT_EQ(zstd_decompress(zstd_compress(""), 0), "");
}

TEST(TinkerWireZstd, RefusesGarbageTruncationAndEmptyInput) {
  expect_user_error([] { zstd_decompress("definitely not zstd", 1000); }, {"zstd", "corrupt"});
  const auto packed = zstd_compress(sample_text(100000));
  expect_user_error([&] { zstd_decompress(packed.substr(0, packed.size() / 2), 1 << 20); },
                    {"zstd", "truncated"});
  expect_user_error([&] { zstd_decompress(packed + "junk", 1 << 20); }, {"zstd"});
  expect_user_error([] { zstd_decompress("", 10); }, {"empty"});
}

TEST(TinkerWireZstd, StopsAtTheOutputLimit) {
  const std::string zeros(8 << 20, '\0');
  const auto bomb = zstd_compress(zeros);
  EXPECT_LT(bomb.size(), 4096u);
  expect_user_error([&] { zstd_decompress(bomb, 1 << 20); }, {"exceeds the limit of 1048576"});
  EXPECT_EQ(zstd_decompress(bomb, zeros.size()).size(), zeros.size());
  expect_user_error([&] { zstd_decompress(bomb, zeros.size() - 1); }, {"exceeds the limit"});
}

TEST(TinkerWireZstd, RefusesWindowsFarBeyondTheOutputLimit) {
  // A streamed frame without a content size keeps its 16 MiB window even for 3 bytes of content.
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> c(ZSTD_createCCtx(), ZSTD_freeCCtx);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_windowLog, 24);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_contentSizeFlag, 0);
  std::string frame(256, '\0');
  ZSTD_outBuffer out{frame.data(), frame.size(), 0};
  ZSTD_inBuffer in{"abc", 3, 0};
  ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(c.get(), &out, &in, ZSTD_e_continue)));
  ZSTD_inBuffer none{nullptr, 0, 0};
  ASSERT_EQ(ZSTD_compressStream2(c.get(), &out, &none, ZSTD_e_end), 0u);
  frame.resize(out.pos);
  EXPECT_EQ(zstd_decompress(frame, 8 << 20), "abc"); // 16 MiB <= 2 x 8 MiB
  expect_user_error([&] { zstd_decompress(frame, 1 << 20); }, {"zstd: corrupt or unsupported"});
}

TEST(TinkerWireZstd, CompressRefusesLevelsOutOfRange) {
  expect_error([] { zstd_compress("x", 0); }, tinker::error_category::server, {"level 0"});
  expect_error([] { zstd_compress("x", 20); }, tinker::error_category::server, {"level 20"});
}

TEST(TinkerWireZstd, DecodeContentHandlesIdentityZstdAndRefusesOthers) {
  EXPECT_EQ(decode_content("plain", "", 100), "plain");
  EXPECT_EQ(decode_content("plain", "identity", 100), "plain");
  EXPECT_EQ(decode_content(zstd_compress("packed"), " ZSTD ", 100), "packed");
  expect_user_error([] { decode_content("x", "gzip", 100); }, {"Content-Encoding", "gzip"});
  expect_user_error([] { decode_content("x", "zstd, gzip", 100); }, {"zstd, gzip"});
  expect_user_error([] { decode_content("too long", "", 3); }, {"exceeds the limit of 3"});
}

} // namespace
} // namespace rlforge::service::test
