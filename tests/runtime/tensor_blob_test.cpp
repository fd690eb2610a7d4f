#include "runtime/tensor_blob.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deep_to_string.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "runtime/errc.hpp"
#include "tests/support/raw_bytes.hpp"

namespace rlforge {
using test_support::from_raw;
using test_support::raw_bytes;
namespace {

// -- helpers ------------------------------------------------------------------------------------

tensor_blob make_blob(dtype type, std::vector<int64_t> shape, std::string bytes) {
  tensor_blob x;
  x.dtype = type;
  x.shape = std::move(shape);
  x.bytes = std::move(bytes);
  return x;
}

std::string encoded(const tensor_blob& x) {
  auto bytes = encode(x);
  EXPECT_TRUE(bytes) << "encode failed: " << error_message(bytes.error());
  return bytes ? *bytes : std::string{};
}

// Expects `decode` to fail with decode_error and a message containing `needle`.
void expect_decode_error(const std::string& input, const std::string& needle) {
  auto result = decode(input);
  ASSERT_FALSE(result) << "decode accepted bad input, expected an error containing \"" << needle
                       << "\"";
  EXPECT_TRUE(is(result.error(), errc::decode_error));
  auto msg = error_message(result.error());
  EXPECT_NE(msg.find(needle), std::string::npos)
      << "message \"" << msg << "\" does not contain \"" << needle << "\"";
}

void expect_invalid(const caf::error& err, const std::string& needle) {
  ASSERT_TRUE(err) << "expected an error containing \"" << needle << "\"";
  EXPECT_TRUE(is(err, errc::invalid_argument));
  auto msg = error_message(err);
  EXPECT_NE(msg.find(needle), std::string::npos)
      << "message \"" << msg << "\" does not contain \"" << needle << "\"";
}

// An independent writer of the documented layout, used to forge encodings `encode` refuses to
// produce. `data_kind` chooses how the data field is written.
struct forged {
  uint64_t version = 1;
  int64_t signed_version = 0; // used when `negative_version` is set
  bool negative_version = false;
  uint64_t code = 1;
  std::vector<int64_t> shape;
  std::string data;
  bool data_as_str = false;
};

std::string forge(const forged& f) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk{buf};
  pk.pack_array(4);
  if (f.negative_version)
    pk.pack_int64(f.signed_version);
  else
    pk.pack_uint64(f.version);
  pk.pack_uint64(f.code);
  pk.pack_array(static_cast<uint32_t>(f.shape.size()));
  for (auto d : f.shape)
    pk.pack_int64(d);
  if (f.data_as_str) {
    pk.pack_str(static_cast<uint32_t>(f.data.size()));
    pk.pack_str_body(f.data.data(), static_cast<uint32_t>(f.data.size()));
  } else {
    pk.pack_bin(static_cast<uint32_t>(f.data.size()));
    pk.pack_bin_body(f.data.data(), static_cast<uint32_t>(f.data.size()));
  }
  return std::string(buf.data(), buf.size());
}

void expect_round_trip(const tensor_blob& x) {
  auto bytes = encode(x);
  ASSERT_TRUE(bytes) << error_message(bytes.error());
  auto back = decode(*bytes);
  ASSERT_TRUE(back) << error_message(back.error());
  EXPECT_EQ(*back, x);
  EXPECT_EQ(back->dtype, x.dtype);
  EXPECT_EQ(back->shape, x.shape);
  EXPECT_EQ(back->bytes, x.bytes);
}

// -- dtype helpers ------------------------------------------------------------------------------

TEST(TensorBlobDtype, ElementSizesMatchTheElementTypes) {
  EXPECT_EQ(element_size(dtype::f32), sizeof(float));
  EXPECT_EQ(element_size(dtype::f64), sizeof(double));
  EXPECT_EQ(element_size(dtype::f16), 2u);
  EXPECT_EQ(element_size(dtype::bf16), 2u);
  EXPECT_EQ(element_size(dtype::i64), sizeof(int64_t));
  EXPECT_EQ(element_size(dtype::i32), sizeof(int32_t));
  EXPECT_EQ(element_size(dtype::i16), sizeof(int16_t));
  EXPECT_EQ(element_size(dtype::i8), sizeof(int8_t));
  EXPECT_EQ(element_size(dtype::u8), sizeof(uint8_t));
  EXPECT_EQ(element_size(dtype::boolean), 1u);
  EXPECT_EQ(element_size(static_cast<dtype>(0)), 0u);
  EXPECT_EQ(element_size(static_cast<dtype>(11)), 0u);
}

TEST(TensorBlobDtype, NamesRoundTripThroughParse) {
  for (auto x : all_dtypes) {
    auto parsed = parse_dtype(to_string(x));
    ASSERT_TRUE(parsed) << to_string(x);
    EXPECT_EQ(*parsed, x);
  }
  EXPECT_EQ(to_string(dtype::boolean), "bool");
  EXPECT_EQ(to_string(dtype::bf16), "bf16");
  EXPECT_EQ(to_string(static_cast<dtype>(99)), "dtype(99)");
}

TEST(TensorBlobDtype, ParsesTorchStyleAliases) {
  EXPECT_EQ(*parse_dtype("float32"), dtype::f32);
  EXPECT_EQ(*parse_dtype("float"), dtype::f32);
  EXPECT_EQ(*parse_dtype("double"), dtype::f64);
  EXPECT_EQ(*parse_dtype("half"), dtype::f16);
  EXPECT_EQ(*parse_dtype("bfloat16"), dtype::bf16);
  EXPECT_EQ(*parse_dtype("long"), dtype::i64);
  EXPECT_EQ(*parse_dtype("int"), dtype::i32);
  EXPECT_EQ(*parse_dtype("short"), dtype::i16);
  EXPECT_EQ(*parse_dtype("int8"), dtype::i8);
  EXPECT_EQ(*parse_dtype("uint8"), dtype::u8);
}

TEST(TensorBlobDtype, RejectsUnknownNamesNamingThem) {
  for (std::string bad : {"", "F32", "float8", "complex64", "bool "}) {
    auto parsed = parse_dtype(bad);
    ASSERT_FALSE(parsed) << "accepted \"" << bad << "\"";
    expect_invalid(parsed.error(), "\"" + bad + "\"");
  }
}

TEST(TensorBlobDtype, ValidCodesAreExactlyTheEnumerators) {
  std::vector<uint64_t> valid;
  for (uint64_t code = 0; code < 300; ++code)
    if (is_valid_dtype_code(code))
      valid.push_back(code);
  EXPECT_EQ(valid, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_FALSE(is_valid_dtype_code(uint64_t{1} << 40));
}

// -- shape arithmetic and validation ------------------------------------------------------------

TEST(TensorBlobShape, NumelIsTheProductOfDimensions) {
  EXPECT_EQ(*shape_numel({}), 1);
  EXPECT_EQ(*shape_numel({0}), 0);
  EXPECT_EQ(*shape_numel({3, 0}), 0);
  EXPECT_EQ(*shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(*shape_numel(std::vector<int64_t>(16, 2)), 65536);
  EXPECT_EQ(*expected_byte_size(dtype::f64, {5, 7}), 5u * 7u * 8u);
  EXPECT_EQ(*expected_byte_size(dtype::bf16, {}), 2u);
}

TEST(TensorBlobShape, RejectsNegativeDimensionsNamingThem) {
  auto n = shape_numel({4, -2});
  ASSERT_FALSE(n);
  expect_invalid(n.error(), "dimension 1 is negative (-2)");
}

TEST(TensorBlobShape, RejectsRankAboveTheLimit) {
  auto n = shape_numel(std::vector<int64_t>(17, 1));
  ASSERT_FALSE(n);
  expect_invalid(n.error(), "rank 17 exceeds the limit 16");
}

TEST(TensorBlobShape, RejectsElementCountOverflowEvenWithAZeroDimension) {
  auto big = int64_t{1} << 40;
  auto n = shape_numel({big, big});
  ASSERT_FALSE(n);
  expect_invalid(n.error(), "overflows int64 at dimension 1");
  // A zero elsewhere does not make the strides representable.
  auto z = shape_numel({0, big, big});
  ASSERT_FALSE(z);
  expect_invalid(z.error(), "overflows int64");
  // The element count fits, the byte count does not.
  auto bytes = expected_byte_size(dtype::f64, {int64_t{1} << 61});
  ASSERT_FALSE(bytes);
  expect_invalid(bytes.error(), "byte size of dtype f64");
}

TEST(TensorBlobShape, ExpectedByteSizeRejectsUnknownDtype) {
  auto bytes = expected_byte_size(static_cast<dtype>(42), {2});
  ASSERT_FALSE(bytes);
  expect_invalid(bytes.error(), "unknown dtype code 42");
}

TEST(TensorBlobValidate, AcceptsConsistentBlobs) {
  EXPECT_FALSE(validate(make_blob(dtype::f32, {2}, std::string(8, '\0'))));
  EXPECT_FALSE(validate(make_blob(dtype::i8, {0, 5}, "")));
  EXPECT_FALSE(validate(make_blob(dtype::boolean, {3}, std::string("\x01\x00\x01", 3))));
}

TEST(TensorBlobValidate, RejectsEveryBrokenInvariant) {
  expect_invalid(validate(make_blob(dtype::f32, {2, 3}, std::string(23, 'x'))),
                 "blob holds 23 bytes, but dtype f32 and shape [2, 3] need 24");
  expect_invalid(validate(make_blob(dtype::f32, {-1}, "")), "dimension 0 is negative (-1)");
  expect_invalid(validate(make_blob(static_cast<dtype>(0), {1}, "x")), "unknown dtype code 0");
  expect_invalid(validate(make_blob(dtype::u8, std::vector<int64_t>(17, 1), "x")), "rank 17");
  expect_invalid(validate(make_blob(dtype::boolean, {3}, std::string("\x01\x00\x02", 3))),
                 "bool element at index 2 has byte value 2");
}

TEST(TensorBlob, EqualityComparesEveryField) {
  auto a = make_blob(dtype::i32, {2}, raw_bytes(std::vector<int32_t>{1, 2}));
  EXPECT_EQ(a, a);
  auto b = a;
  b.dtype = dtype::f32;
  EXPECT_NE(a, b);
  auto c = a;
  c.shape = {1, 2};
  EXPECT_NE(a, c);
  auto d = a;
  d.bytes[7] = 9;
  EXPECT_NE(a, d);
}

// -- encoding layout and round trips ------------------------------------------------------------

TEST(TensorBlobEncode, WritesTheDocumentedLayout) {
  // [1, dtype f32 = 1, [2], bin8(1.0f, -2.0f)] spelled byte by byte from the msgpack spec.
  auto x = make_blob(dtype::f32, {2}, raw_bytes(std::vector<float>{1.0f, -2.0f}));
  std::string expected = "\x94\x01\x01\x91\x02\xc4\x08";
  expected += x.bytes;
  EXPECT_EQ(encoded(x), expected);
  // A 0-d i64: empty shape array (0x90), dtype code 5.
  auto s = make_blob(dtype::i64, {}, raw_bytes(std::vector<int64_t>{-7}));
  std::string expected_scalar = std::string("\x94\x01\x05\x90\xc4\x08", 6) + s.bytes;
  EXPECT_EQ(encoded(s), expected_scalar);
}

TEST(TensorBlobEncode, RoundTripsF32Values) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.5f,
                               -3.25f,
                               1e-38f,
                               3.4e38f,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  auto x = make_blob(dtype::f32, {2, 4}, raw_bytes(values));
  expect_round_trip(x);
  auto back = decode(encoded(x));
  ASSERT_TRUE(back);
  auto floats = from_raw<float>(back->bytes);
  ASSERT_EQ(floats.size(), values.size());
  for (size_t i = 0; i + 1 < values.size(); ++i)
    EXPECT_EQ(floats[i], values[i]) << "index " << i;
  EXPECT_TRUE(std::isnan(floats.back()));
  EXPECT_TRUE(std::signbit(floats[1]));
}

TEST(TensorBlobEncode, RoundTripsBf16AndF16BitPatterns) {
  // bf16 1.0 = 0x3f80, -2.0 = 0xc000, smallest subnormal 0x0001, NaN 0x7fc1; f16 1.0 = 0x3c00.
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x0001, 0x7fc1, 0x8000, 0x7f80};
  expect_round_trip(make_blob(dtype::bf16, {3, 2}, raw_bytes(bf16)));
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7e00, 0x7bff};
  expect_round_trip(make_blob(dtype::f16, {5}, raw_bytes(f16)));
}

TEST(TensorBlobEncode, RoundTripsIntegersAndBools) {
  expect_round_trip(
      make_blob(dtype::i64, {3},
                raw_bytes(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1,
                                               std::numeric_limits<int64_t>::max()})));
  expect_round_trip(
      make_blob(dtype::i32, {2, 2},
                raw_bytes(std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 0, 7,
                                               std::numeric_limits<int32_t>::max()})));
  expect_round_trip(make_blob(dtype::i16, {2}, raw_bytes(std::vector<int16_t>{-32768, 32767})));
  expect_round_trip(make_blob(dtype::i8, {2}, raw_bytes(std::vector<int8_t>{-128, 127})));
  expect_round_trip(make_blob(dtype::u8, {3}, raw_bytes(std::vector<uint8_t>{0, 128, 255})));
  expect_round_trip(make_blob(dtype::f64, {1}, raw_bytes(std::vector<double>{-0.1})));
  expect_round_trip(
      make_blob(dtype::boolean, {2, 3}, raw_bytes(std::vector<uint8_t>{1, 0, 0, 1, 1, 1})));
}

TEST(TensorBlobEncode, RoundTripsEmptyAndScalarTensors) {
  for (auto type : all_dtypes) {
    expect_round_trip(make_blob(type, {0}, ""));
    expect_round_trip(make_blob(type, {3, 0}, ""));
    expect_round_trip(make_blob(type, {0, 1 << 20, 7}, ""));
    std::string one(element_size(type), '\0');
    if (type == dtype::boolean)
      one[0] = 1;
    else
      one[0] = 0x2a;
    auto scalar = make_blob(type, {}, one);
    expect_round_trip(scalar);
    auto back = decode(encoded(scalar));
    ASSERT_TRUE(back);
    EXPECT_TRUE(back->shape.empty());
  }
}

TEST(TensorBlobEncode, RoundTripsA64MiBTensor) {
  constexpr size_t n = (64u << 20) / sizeof(float);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i)
    values[i] = static_cast<float>(i % 4099) * 0.5f - 1000.0f;
  auto x = make_blob(dtype::f32, {4096, static_cast<int64_t>(n / 4096)}, raw_bytes(values));
  values.clear();
  values.shrink_to_fit();
  auto bytes = encode(x);
  ASSERT_TRUE(bytes);
  // Array tag, version, code, shape tag, two uint16 dimensions (3 bytes each), bin32 tag (5).
  EXPECT_EQ(bytes->size(), x.bytes.size() + 1 + 1 + 1 + 1 + 3 + 3 + 5);
  auto back = decode(*bytes);
  ASSERT_TRUE(back) << error_message(back.error());
  EXPECT_EQ(back->shape, x.shape);
  EXPECT_TRUE(back->bytes == x.bytes);
  float probe = 0;
  std::memcpy(&probe, back->bytes.data() + 4 * 5000, 4);
  EXPECT_EQ(probe, static_cast<float>(5000 % 4099) * 0.5f - 1000.0f);
}

TEST(TensorBlobEncode, RejectsInvalidBlobsNamingTheProblem) {
  auto mismatch = encode(make_blob(dtype::f32, {3}, std::string(11, 'a')));
  ASSERT_FALSE(mismatch);
  expect_invalid(mismatch.error(), "blob holds 11 bytes");
  auto negative = encode(make_blob(dtype::u8, {2, -5}, ""));
  ASSERT_FALSE(negative);
  expect_invalid(negative.error(), "dimension 1 is negative (-5)");
  auto unknown = encode(make_blob(static_cast<dtype>(77), {1}, "a"));
  ASSERT_FALSE(unknown);
  expect_invalid(unknown.error(), "unknown dtype code 77");
  auto bad_bool = encode(make_blob(dtype::boolean, {1}, "\x05"));
  ASSERT_FALSE(bad_bool);
  expect_invalid(bad_bool.error(), "byte value 5");
}

TEST(TensorBlobEncode, EncodeToReplacesTheBufferContent) {
  auto x = make_blob(dtype::i32, {3}, raw_bytes(std::vector<int32_t>{4, 5, 6}));
  std::string buf(1000, 'z');
  ASSERT_FALSE(encode_to(x, buf));
  EXPECT_EQ(buf, encoded(x));
  EXPECT_GE(buf.capacity(), 1000u); // the existing allocation was kept
  auto bad = encode_to(make_blob(dtype::i32, {3}, "short"), buf);
  expect_invalid(bad, "blob holds 5 bytes");
  EXPECT_TRUE(buf.empty());
}

TEST(TensorBlobDecode, DecodeIntoReplacesOrKeepsTheBlob) {
  auto x = make_blob(dtype::f64, {2}, raw_bytes(std::vector<double>{0.25, -8.0}));
  auto previous = make_blob(dtype::u8, {4, 4}, std::string(16, 'p'));
  auto out = previous;
  ASSERT_FALSE(decode_into(encoded(x), out));
  EXPECT_EQ(out, x);
  // A failed decode leaves the target as it was.
  out = previous;
  auto err = decode_into(encoded(x) + "!", out);
  ASSERT_TRUE(err);
  EXPECT_TRUE(is(err, errc::decode_error));
  EXPECT_EQ(out, previous);
  err = decode_into(std::string_view{}, out);
  EXPECT_TRUE(is(err, errc::decode_error));
  EXPECT_EQ(out, previous);
}

// -- decoding bad input -------------------------------------------------------------------------

TEST(TensorBlobDecode, RejectsEveryTruncation) {
  auto full =
      encoded(make_blob(dtype::i16, {2, 3}, raw_bytes(std::vector<int16_t>{1, 2, 3, 4, 5, 6})));
  ASSERT_TRUE(decode(full));
  expect_decode_error(full.substr(0, 0), "empty input");
  for (size_t len = 1; len < full.size(); ++len)
    expect_decode_error(full.substr(0, len), "truncated input: " + std::to_string(len) + " bytes");
}

TEST(TensorBlobDecode, RejectsNullAndEmptyInput) {
  auto r = decode(nullptr, 0);
  ASSERT_FALSE(r);
  EXPECT_TRUE(is(r.error(), errc::decode_error));
  auto n = decode(nullptr, 5);
  ASSERT_FALSE(n);
  EXPECT_NE(error_message(n.error()).find("null data pointer with size 5"), std::string::npos);
  auto v = decode(std::string_view{});
  ASSERT_FALSE(v);
  EXPECT_TRUE(is(v.error(), errc::decode_error));
}

TEST(TensorBlobDecode, RejectsGarbage) {
  expect_decode_error(std::string("\xc1", 1), "malformed msgpack");
  expect_decode_error("\xa5hello", "top-level value is a str");
  expect_decode_error(std::string("\x80", 1), "top-level value is a map");
  expect_decode_error(std::string("\x81\x01\x02", 3), "unexpected non-empty msgpack map");
  expect_decode_error(std::string("\x93\x01\x01\x90", 4), "top-level array has 3 elements");
  expect_decode_error(std::string("\x94\x01\x01\x91\x91\x01\xc4\x00", 8),
                      "msgpack nesting deeper than 2");
  expect_decode_error("\x2a", "top-level value is a unsigned integer");
}

TEST(TensorBlobDecode, RejectsWrongFormatVersion) {
  forged f;
  f.shape = {1};
  f.data = std::string(4, '\0');
  ASSERT_TRUE(decode(forge(f)));
  f.version = 2;
  expect_decode_error(forge(f), "unsupported format version 2 (this build reads version 1)");
  f.version = 0;
  expect_decode_error(forge(f), "unsupported format version 0");
  f.negative_version = true;
  f.signed_version = -1;
  expect_decode_error(forge(f), "format version is negative (-1)");
  // A version written as a string.
  std::string as_str = "\x94\xa1"
                       "1"
                       "\x01\x91\x01\xc4\x04" +
                       std::string(4, '\0');
  expect_decode_error(as_str, "format version is a str, expected an unsigned integer");
}

TEST(TensorBlobDecode, RejectsUnknownDtypeCodes) {
  forged f;
  f.shape = {1};
  f.data = "\x01";
  for (uint64_t code : {uint64_t{0}, uint64_t{11}, uint64_t{255}, uint64_t{1} << 33}) {
    f.code = code;
    expect_decode_error(forge(f), "unknown dtype code " + std::to_string(code));
  }
  std::string nil_code = std::string("\x94\x01\xc0\x91\x01\xc4\x01\x01", 8);
  expect_decode_error(nil_code, "dtype code is a nil");
}

TEST(TensorBlobDecode, RejectsNegativeAndMistypedShapeEntries) {
  forged f;
  f.code = static_cast<uint64_t>(dtype::u8);
  f.shape = {2, -3};
  expect_decode_error(forge(f), "dimension 1 is negative (-3)");
  // [1, 9, [2.0], bin 2]
  std::string float_dim = std::string("\x94\x01\x09\x91\xcb", 5);
  double two = 2.0;
  uint64_t bits = 0;
  std::memcpy(&bits, &two, 8);
  for (int i = 7; i >= 0; --i)
    float_dim += static_cast<char>((bits >> (8 * i)) & 0xff);
  float_dim += std::string("\xc4\x02xy", 4);
  expect_decode_error(float_dim, "dimension 0 is a float64, expected an integer");
  // A uint64 dimension above int64's range: 0xcf + 8 bytes of 0xff.
  std::string huge_dim =
      std::string("\x94\x01\x09\x91\xcf", 5) + std::string(8, '\xff') + std::string("\xc4\x00", 2);
  expect_decode_error(huge_dim, "dimension 0 is 18446744073709551615, larger than int64");
  // The shape field itself not an array.
  std::string shape_int = std::string("\x94\x01\x09\x05\xc4\x05", 6) + "abcde";
  expect_decode_error(shape_int, "shape is a unsigned integer, expected an array");
}

TEST(TensorBlobDecode, RejectsRankAboveTheLimit) {
  forged f;
  f.code = static_cast<uint64_t>(dtype::u8);
  f.shape = std::vector<int64_t>(17, 1);
  f.data = "z";
  expect_decode_error(forge(f), "rank 17 exceeds the limit 16");
  f.shape = std::vector<int64_t>(65, 1);
  expect_decode_error(forge(f), "msgpack array is longer than 64");
}

TEST(TensorBlobDecode, RejectsSizeMismatch) {
  forged f;
  f.code = static_cast<uint64_t>(dtype::f32);
  f.shape = {2};
  f.data = std::string(7, '\0');
  expect_decode_error(forge(f), "data has 7 bytes, but dtype f32 and shape [2] need 8");
  f.data = std::string(9, '\0');
  expect_decode_error(forge(f), "data has 9 bytes");
  f.shape = {int64_t{1} << 40, int64_t{1} << 40};
  expect_decode_error(forge(f), "overflows int64");
}

TEST(TensorBlobDecode, RejectsDataThatIsNotBin) {
  forged f;
  f.code = static_cast<uint64_t>(dtype::u8);
  f.shape = {3};
  f.data = "abc";
  f.data_as_str = true;
  expect_decode_error(forge(f), "data is a str, expected bin");
}

TEST(TensorBlobDecode, RejectsBoolBytesOtherThanZeroOrOne) {
  forged f;
  f.code = static_cast<uint64_t>(dtype::boolean);
  f.shape = {4};
  f.data = std::string("\x00\x01\x01\xff", 4);
  expect_decode_error(forge(f), "bool element at index 3 has byte value 255");
}

TEST(TensorBlobDecode, RejectsTrailingBytes) {
  auto good = encoded(make_blob(dtype::u8, {2}, "ab"));
  expect_decode_error(good + "X", "1 trailing bytes after the " + std::to_string(good.size()) +
                                      "-byte encoded blob");
  expect_decode_error(good + good, std::to_string(good.size()) + " trailing bytes");
}

TEST(TensorBlobDecode, ForgedLengthsDoNotDriveAllocations) {
  // bin32 claiming 4 GiB - 1 bytes with 3 present: rejected as truncated before any copy.
  std::string bin = std::string("\x94\x01\x09\x91\x03\xc6\xff\xff\xff\xff", 10) + "abc";
  expect_decode_error(bin, "truncated input");
  // array32 claiming 4 billion elements: rejected before msgpack allocates the element table.
  expect_decode_error(std::string("\xdd\xff\xff\xff\xff\x01", 6), "longer than 64 elements");
  // map32 claiming 4 billion pairs.
  expect_decode_error(std::string("\xdf\xff\xff\xff\xff", 5), "unexpected non-empty msgpack map");
  // str32 claiming 4 GiB at top level.
  expect_decode_error(std::string("\xdb\xff\xff\xff\xffxyz", 8), "truncated input");
}

// -- randomized corruption ----------------------------------------------------------------------

// Checks the decode contract on arbitrary input: either a self-consistent blob that re-encodes
// to an equivalent encoding, or a decode_error with a message.
void check_decode_contract(const std::string& input, size_t& accepted, size_t& rejected) {
  auto result = decode(input);
  if (result) {
    ++accepted;
    ASSERT_FALSE(validate(*result)) << error_message(validate(*result));
    auto size = expected_byte_size(result->dtype, result->shape);
    ASSERT_TRUE(size);
    ASSERT_EQ(*size, result->bytes.size());
    auto again = encode(*result);
    ASSERT_TRUE(again);
    auto back = decode(*again);
    ASSERT_TRUE(back);
    ASSERT_EQ(*back, *result);
  } else {
    ++rejected;
    ASSERT_TRUE(is(result.error(), errc::decode_error));
    ASSERT_EQ(error_message(result.error()).rfind("tensor_blob decode: ", 0), 0u)
        << error_message(result.error());
  }
}

std::vector<std::string> corpus_of_valid_encodings() {
  std::vector<std::string> out;
  out.push_back(encoded(make_blob(dtype::f32, {2, 2}, raw_bytes(std::vector<float>{1, 2, 3, 4}))));
  out.push_back(encoded(make_blob(dtype::bf16, {3}, raw_bytes(std::vector<uint16_t>{1, 2, 3}))));
  out.push_back(encoded(make_blob(dtype::i64, {}, raw_bytes(std::vector<int64_t>{-5}))));
  out.push_back(encoded(make_blob(dtype::boolean, {2, 1, 2}, std::string("\x01\x00\x00\x01", 4))));
  out.push_back(encoded(make_blob(dtype::u8, {3, 0}, "")));
  out.push_back(encoded(make_blob(dtype::i8, {300}, std::string(300, '\x07'))));
  out.push_back(encoded(make_blob(dtype::f64, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                  std::string(8, '\0'))));
  return out;
}

TEST(TensorBlobFuzz, RandomCorruptionsNeverCrash) {
  std::mt19937_64 rng{0x5eed'7e45'0b10'b001};
  auto corpus = corpus_of_valid_encodings();
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  size_t accepted = 0;
  size_t rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string input = corpus[pick(corpus.size())];
    int mutations = 1 + static_cast<int>(pick(4));
    for (int m = 0; m < mutations; ++m) {
      switch (pick(6)) {
      case 0: // flip one bit
        if (!input.empty())
          input[pick(input.size())] ^= static_cast<char>(1u << pick(8));
        break;
      case 1: // replace a byte, biased to the header where the structure lives
        if (!input.empty())
          input[pick(std::min<size_t>(input.size(), 24))] = static_cast<char>(rng());
        break;
      case 2: // truncate
        input.resize(pick(input.size() + 1));
        break;
      case 3: // insert random bytes
        input.insert(pick(input.size() + 1), std::string(1 + pick(4), static_cast<char>(rng())));
        break;
      case 4: // append
        input.push_back(static_cast<char>(rng()));
        break;
      case 5: // a byte from msgpack's marker ranges (length prefixes, containers)
        if (!input.empty()) {
          static const unsigned char markers[] = {0x90, 0x91, 0x94, 0x9f, 0xc0, 0xc4, 0xc5,
                                                  0xc6, 0xca, 0xcb, 0xcf, 0xd3, 0xdc, 0xdd,
                                                  0xde, 0xdf, 0xff, 0x80, 0xa1};
          input[pick(std::min<size_t>(input.size(), 16))] =
              static_cast<char>(markers[pick(sizeof(markers))]);
        }
        break;
      }
    }
    check_decode_contract(input, accepted, rejected);
    if (::testing::Test::HasFatalFailure())
      FAIL() << "iteration " << iter;
  }
  // Both outcomes must occur, or the mutations are not exercising the decoder.
  EXPECT_GT(accepted, 100u);
  EXPECT_GT(rejected, 1000u);
}

TEST(TensorBlobFuzz, RandomBuffersNeverCrash) {
  std::mt19937_64 rng{42};
  size_t accepted = 0;
  size_t rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string input(rng() % 64, '\0');
    for (auto& c : input)
      c = static_cast<char>(rng());
    // Half the buffers start with the right array tag and version to get past the first checks.
    if (iter % 2 == 0 && input.size() >= 2) {
      input[0] = '\x94';
      input[1] = '\x01';
    }
    check_decode_contract(input, accepted, rejected);
    if (::testing::Test::HasFatalFailure())
      FAIL() << "iteration " << iter;
  }
  EXPECT_GT(rejected, 19000u);
}

TEST(TensorBlobFuzz, RandomWellFormedMsgpackIsJudgedByTheSpec) {
  // Structure-aware: valid msgpack with the right shape but random field values and types, so
  // every validation branch runs. An independent oracle decides whether decode must accept.
  std::mt19937_64 rng{7};
  size_t accepted = 0;
  size_t rejected = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk{buf};
    bool ok = true;
    pk.pack_array(4);
    uint64_t version = rng() % 4 == 0 ? rng() % 3 : 1;
    pk.pack_uint64(version);
    ok = ok && version == 1;
    uint64_t code = rng() % 4 == 0 ? rng() % 16 : 1 + rng() % 10;
    pk.pack_uint64(code);
    ok = ok && code >= 1 && code <= 10;
    size_t rank = rng() % 20;
    pk.pack_array(static_cast<uint32_t>(rank));
    ok = ok && rank <= 16;
    uint64_t numel = 1;
    for (size_t i = 0; i < rank; ++i) {
      int64_t dim =
          rng() % 8 == 0 ? -static_cast<int64_t>(rng() % 3) : static_cast<int64_t>(rng() % 3);
      pk.pack_int64(dim);
      ok = ok && dim >= 0;
      numel *= dim < 0 ? 0 : static_cast<uint64_t>(dim);
    }
    size_t elem = code >= 1 && code <= 10 ? element_size(static_cast<dtype>(code)) : 1;
    size_t want = ok ? static_cast<size_t>(numel) * elem : rng() % 16;
    size_t len = rng() % 4 == 0 ? rng() % 16 : want;
    std::string data(len, '\0');
    for (auto& c : data)
      c = static_cast<char>(code == 10 ? rng() % 2 : rng());
    pk.pack_bin(static_cast<uint32_t>(len));
    pk.pack_bin_body(data.data(), static_cast<uint32_t>(len));
    ok = ok && len == want;
    auto result = decode(buf.data(), buf.size());
    ASSERT_EQ(static_cast<bool>(result), ok)
        << "iteration " << iter << ": "
        << (result ? std::string{"accepted"} : error_message(result.error()));
    if (result) {
      ++accepted;
      EXPECT_EQ(result->bytes, data);
    } else {
      ++rejected;
      EXPECT_TRUE(is(result.error(), errc::decode_error));
    }
  }
  EXPECT_GT(accepted, 500u);
  EXPECT_GT(rejected, 500u);
}

// -- CAF integration ----------------------------------------------------------------------------

TEST(TensorBlobCaf, SerializesThroughCafInspect) {
  auto x = make_blob(dtype::bf16, {2, 1}, raw_bytes(std::vector<uint16_t>{0x3f80, 0x4000}));
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  ASSERT_FALSE(sink(x));
  tensor_blob y;
  caf::binary_deserializer source{nullptr, buf};
  ASSERT_FALSE(source(y));
  EXPECT_EQ(x, y);
}

TEST(TensorBlobCaf, DeserializationRejectsInconsistentBlobs) {
  // Serialize field by field (as inspect does) a blob whose bytes do not match its shape.
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  uint8_t code = static_cast<uint8_t>(dtype::f32);
  std::vector<int64_t> shape{3};
  std::string bytes(5, 'q');
  ASSERT_FALSE(sink(code, shape, bytes));
  tensor_blob y;
  caf::binary_deserializer source{nullptr, buf};
  auto err = source(y);
  ASSERT_TRUE(err);
  EXPECT_TRUE(is(err, errc::decode_error));
  EXPECT_NE(error_message(err).find("blob holds 5 bytes"), std::string::npos) << error_message(err);
  // An unknown dtype code.
  std::vector<char> buf2;
  caf::binary_serializer sink2{nullptr, buf2};
  uint8_t bad_code = 99;
  std::string one = "a";
  std::vector<int64_t> one_dim{1};
  ASSERT_FALSE(sink2(bad_code, one_dim, one));
  caf::binary_deserializer source2{nullptr, buf2};
  auto err2 = source2(y);
  ASSERT_TRUE(err2);
  EXPECT_NE(error_message(err2).find("unknown dtype code 99"), std::string::npos);
}

TEST(TensorBlobCaf, IsAMessageElementWithASummaryString) {
  auto x = make_blob(dtype::f32, {2, 3}, std::string(24, '\0'));
  auto msg = caf::make_message(x);
  ASSERT_TRUE(msg.match_element<tensor_blob>(0));
  EXPECT_EQ(msg.get_as<tensor_blob>(0), x);
  auto text = caf::deep_to_string(x);
  EXPECT_EQ(text, "tensor_blob(\"f32\", [2, 3], 24)");
}

} // namespace
} // namespace rlforge
