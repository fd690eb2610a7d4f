// Fuzzes the tensor wire decoder: any input either decodes to a valid blob whose re-encoding
// decodes to the same blob (and re-encodes byte for byte), or fails with decode_error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.hpp"
#include "runtime/errc.hpp"
#include "runtime/tensor_blob.hpp"

namespace rlforge::fuzz {

namespace {

std::string encoding_of(dtype type, std::vector<int64_t> shape, std::string bytes) {
  tensor_blob x;
  x.dtype = type;
  x.shape = std::move(shape);
  x.bytes = std::move(bytes);
  auto out = encode(x);
  if (!out)
    check(false, "a seed blob does not encode: " + error_message(out.error()));
  return *out;
}

} // namespace

std::vector<std::string> seeds() {
  std::vector<std::string> out;
  float f32[] = {1.0f, -2.5f, 0.0f, 3.0e38f, 1.0e-30f, -0.0f};
  out.push_back(encoding_of(dtype::f32, {2, 3}, std::string(reinterpret_cast<char*>(f32), 24)));
  out.push_back(encoding_of(dtype::bf16, {4}, std::string("\x80\x3f\x00\xc0\x01\x00\xc1\x7f", 8)));
  out.push_back(encoding_of(dtype::f16, {1, 1}, std::string("\x00\x3c", 2)));
  out.push_back(encoding_of(dtype::i64, {}, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)));
  out.push_back(encoding_of(dtype::i32, {0}, ""));
  out.push_back(encoding_of(dtype::u8, {3, 0}, ""));
  out.push_back(encoding_of(dtype::boolean, {2, 2}, std::string("\x01\x00\x00\x01", 4)));
  out.push_back(encoding_of(dtype::i8, {200}, std::string(200, '\x05')));
  out.push_back(encoding_of(dtype::f64, std::vector<int64_t>(16, 1), std::string(8, '\x01')));
  // Near misses: truncated data, trailing byte, wrong version, negative dimension.
  out.push_back(encoding_of(dtype::i16, {300}, std::string(600, '\0')).substr(0, 64));
  out.push_back(out[0] + std::string(1, '\0'));
  std::string v2 = out[2];
  v2[1] = '\x02';
  out.push_back(v2);
  out.push_back(std::string("\x94\x01\x09\x91\xff\xc4\x00", 7));
  return out;
}

} // namespace rlforge::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlforge;
  using rlforge::fuzz::check;
  auto blob = decode(reinterpret_cast<const char*>(data), size);
  if (!blob) {
    check(is(blob.error(), errc::decode_error),
          "decode failed with a code other than decode_error");
    check(error_message(blob.error()).rfind("tensor_blob decode: ", 0) == 0,
          "decode error without a message");
    return 0;
  }
  if (auto err = validate(*blob))
    check(false, "decode accepted an invalid blob: " + error_message(err));
  auto again = encode(*blob);
  if (!again)
    check(false, "a decoded blob does not encode: " + error_message(again.error()));
  auto back = decode(*again);
  if (!back)
    check(false, "a re-encoded blob does not decode: " + error_message(back.error()));
  check(*back == *blob, "decode(encode(decode(x))) differs from decode(x)");
  auto third = encode(*back);
  check(third && *third == *again, "encode is not deterministic");
  return 0;
}
