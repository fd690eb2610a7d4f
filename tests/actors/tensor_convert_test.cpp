#include "actors/tensor_convert.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "runtime/errc.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/support/raw_bytes.hpp"

namespace rlforge::actors {
using test_support::raw_bytes;
namespace {

uint32_t float_bits(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  return bits;
}

tensor_blob blob_or_fail(const at::Tensor& t) {
  auto blob = to_blob(t);
  EXPECT_TRUE(blob) << error_message(blob.error());
  return blob ? *blob : tensor_blob{};
}

// Exact comparison that also holds for NaNs: same dtype, shape and bytes.
void expect_same_tensor(const at::Tensor& a, const at::Tensor& b) {
  ASSERT_EQ(a.scalar_type(), b.scalar_type());
  ASSERT_EQ(a.sizes(), b.sizes());
  auto ac = a.contiguous();
  auto bc = b.contiguous();
  auto n = static_cast<size_t>(ac.numel()) * ac.element_size();
  if (n > 0) {
    EXPECT_EQ(std::memcmp(ac.data_ptr(), bc.data_ptr(), n), 0);
  }
}

void expect_round_trip(const at::Tensor& t) {
  auto blob = to_blob(t);
  ASSERT_TRUE(blob) << error_message(blob.error());
  EXPECT_EQ(blob->shape, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
  auto back = from_blob(*blob);
  ASSERT_TRUE(back) << error_message(back.error());
  EXPECT_TRUE(back->is_contiguous());
  expect_same_tensor(*back, t);
}

TEST(TensorConvert, ScalarTypeMappingIsABijection) {
  for (auto x : all_dtypes) {
    auto st = to_scalar_type(x);
    ASSERT_TRUE(st) << to_string(x);
    EXPECT_EQ(c10::elementSize(*st), element_size(x)) << to_string(x);
    auto back = to_dtype(*st);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, x);
  }
  EXPECT_EQ(*to_scalar_type(dtype::bf16), at::kBFloat16);
  EXPECT_EQ(*to_scalar_type(dtype::f16), at::kHalf);
  EXPECT_EQ(*to_scalar_type(dtype::i8), at::kChar);
  EXPECT_EQ(*to_scalar_type(dtype::u8), at::kByte);
  EXPECT_EQ(*to_scalar_type(dtype::boolean), at::kBool);
}

TEST(TensorConvert, RejectsUnsupportedTorchDtypesNamingThem) {
  for (auto st : {at::kComplexFloat, at::kComplexDouble, at::kQInt8, at::kQUInt8}) {
    auto x = to_dtype(st);
    ASSERT_FALSE(x);
    EXPECT_TRUE(is(x.error(), errc::unsupported));
    EXPECT_NE(error_message(x.error()).find(c10::toString(st)), std::string::npos)
        << error_message(x.error());
  }
  auto bad = to_scalar_type(static_cast<dtype>(0));
  ASSERT_FALSE(bad);
  EXPECT_TRUE(is(bad.error(), errc::invalid_argument));
  EXPECT_NE(error_message(bad.error()).find("dtype code 0"), std::string::npos);
}

TEST(TensorConvert, F32BytesAreTheRowMajorElements) {
  std::vector<float> values = {1.5f, -2.0f, 0.0f, 3.25f, -0.0f, 1e-30f};
  auto t = at::tensor(at::ArrayRef<float>(values)).reshape({2, 3});
  auto blob = blob_or_fail(t);
  EXPECT_EQ(blob.dtype, dtype::f32);
  EXPECT_EQ(blob.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(blob.bytes, raw_bytes(values));
  expect_round_trip(t);
}

TEST(TensorConvert, Bf16AndF16CarryTheirBitPatterns) {
  // Values exactly representable in both formats.
  std::vector<float> values = {1.0f, -2.5f, 0.5f, 96.0f};
  auto f = at::tensor(at::ArrayRef<float>(values));
  auto bf = blob_or_fail(f.to(at::kBFloat16));
  EXPECT_EQ(bf.dtype, dtype::bf16);
  std::vector<uint16_t> bf_bits;
  for (float v : values)
    bf_bits.push_back(static_cast<uint16_t>(float_bits(v) >> 16)); // bf16 = upper half of f32
  EXPECT_EQ(bf.bytes, raw_bytes(bf_bits));
  auto h = blob_or_fail(f.to(at::kHalf));
  EXPECT_EQ(h.dtype, dtype::f16);
  // IEEE binary16: 1.0 = 0x3c00, -2.5 = 0xc100, 0.5 = 0x3800, 96 = 0x5600.
  EXPECT_EQ(h.bytes, raw_bytes(std::vector<uint16_t>{0x3c00, 0xc100, 0x3800, 0x5600}));
  expect_round_trip(f.to(at::kBFloat16));
  expect_round_trip(f.to(at::kHalf));
}

TEST(TensorConvert, RoundTripsEveryDtypeExactly) {
  auto base = at::arange(-6, 6, at::kLong).reshape({3, 4});
  for (auto x : all_dtypes) {
    auto st = *to_scalar_type(x);
    auto t = x == dtype::boolean ? base.remainder(3).eq(0) : base.to(st);
    if (x == dtype::u8)
      t = (base + 6).to(st);
    SCOPED_TRACE(to_string(x));
    expect_round_trip(t);
    auto blob = blob_or_fail(t);
    EXPECT_EQ(blob.dtype, x);
    EXPECT_EQ(blob.bytes.size(), 12 * element_size(x));
  }
}

TEST(TensorConvert, RoundTripsExtremeAndNonFiniteValues) {
  expect_round_trip(at::tensor(std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                                    std::numeric_limits<int64_t>::max()}));
  expect_round_trip(at::tensor(std::vector<double>{std::numeric_limits<double>::quiet_NaN(),
                                                   std::numeric_limits<double>::infinity(),
                                                   std::numeric_limits<double>::denorm_min()}));
  auto nan_bf16 = at::full({2}, std::numeric_limits<float>::quiet_NaN()).to(at::kBFloat16);
  expect_round_trip(nan_bf16);
}

TEST(TensorConvert, NonContiguousInputIsGatheredRowMajor) {
  auto t = at::arange(12, at::kFloat).reshape({3, 4}).t(); // shape {4, 3}, strides {1, 4}
  ASSERT_FALSE(t.is_contiguous());
  auto blob = blob_or_fail(t);
  EXPECT_EQ(blob.shape, (std::vector<int64_t>{4, 3}));
  // Element (i, j) of the transpose is original element (j, i) = 4 * j + i.
  std::vector<float> expected;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      expected.push_back(static_cast<float>(4 * j + i));
  EXPECT_EQ(blob.bytes, raw_bytes(expected));
  expect_round_trip(t);
  // A strided slice and a stride-0 expansion.
  auto every_other = at::arange(10, at::kInt).slice(0, 1, 10, 2);
  EXPECT_EQ(blob_or_fail(every_other).bytes, raw_bytes(std::vector<int32_t>{1, 3, 5, 7, 9}));
  auto expanded = at::tensor(std::vector<int16_t>{7, 8}).unsqueeze(0).expand({3, 2});
  EXPECT_EQ(blob_or_fail(expanded).bytes, raw_bytes(std::vector<int16_t>{7, 8, 7, 8, 7, 8}));
}

TEST(TensorConvert, ZeroDimAndEmptyTensors) {
  auto scalar = at::scalar_tensor(3.5, at::kDouble);
  auto blob = blob_or_fail(scalar);
  EXPECT_TRUE(blob.shape.empty());
  EXPECT_EQ(blob.bytes, raw_bytes(std::vector<double>{3.5}));
  auto back = from_blob(blob);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->dim(), 0);
  EXPECT_EQ(back->item<double>(), 3.5);
  for (auto shape :
       {std::vector<int64_t>{0}, std::vector<int64_t>{3, 0}, std::vector<int64_t>{0, 5, 2}}) {
    auto empty = at::empty(shape, at::kBFloat16);
    auto b = blob_or_fail(empty);
    EXPECT_EQ(b.shape, shape);
    EXPECT_TRUE(b.bytes.empty());
    expect_round_trip(empty);
  }
}

TEST(TensorConvert, GradTensorsAreCopiedWithoutHistory) {
  auto w = at::ones({2, 2}, at::kFloat).set_requires_grad(true);
  auto y = w * 3;
  auto blob = blob_or_fail(y);
  EXPECT_EQ(blob.bytes, raw_bytes(std::vector<float>(4, 3.0f)));
  auto back = from_blob(blob);
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->requires_grad());
}

TEST(TensorConvert, ResultsOwnTheirMemory) {
  auto t = at::arange(4, at::kFloat);
  auto blob = blob_or_fail(t);
  t.fill_(-1.0f); // the blob must not alias the tensor
  EXPECT_EQ(blob.bytes, raw_bytes(std::vector<float>{0, 1, 2, 3}));
  auto back = from_blob(blob);
  ASSERT_TRUE(back);
  blob.bytes.assign(16, '\0'); // nor the tensor the blob
  EXPECT_EQ(back->sum().item<float>(), 6.0f);
}

TEST(TensorConvert, SurvivesTheWireFormat) {
  auto t = at::arange(24, at::kFloat).reshape({2, 3, 4}).to(at::kBFloat16).permute({2, 0, 1});
  auto blob = blob_or_fail(t);
  auto wire = encode(blob);
  ASSERT_TRUE(wire);
  auto decoded = decode(*wire);
  ASSERT_TRUE(decoded);
  auto back = from_blob(*decoded);
  ASSERT_TRUE(back);
  expect_same_tensor(*back, t);
}

TEST(TensorConvert, ToBlobRejectsBadTensors) {
  auto undefined = to_blob(at::Tensor{});
  ASSERT_FALSE(undefined);
  EXPECT_TRUE(is(undefined.error(), errc::invalid_argument));
  EXPECT_NE(error_message(undefined.error()).find("undefined"), std::string::npos);

  auto complex = to_blob(at::zeros({2}, at::kComplexFloat));
  ASSERT_FALSE(complex);
  EXPECT_TRUE(is(complex.error(), errc::unsupported));
  EXPECT_NE(error_message(complex.error()).find("ComplexFloat"), std::string::npos);

  auto sparse = to_blob(at::eye(3, at::kFloat).to_sparse());
  ASSERT_FALSE(sparse);
  EXPECT_TRUE(is(sparse.error(), errc::unsupported));
  EXPECT_NE(error_message(sparse.error()).find("Sparse"), std::string::npos)
      << error_message(sparse.error());

  auto deep = to_blob(at::zeros(std::vector<int64_t>(17, 1), at::kFloat));
  ASSERT_FALSE(deep);
  EXPECT_TRUE(is(deep.error(), errc::invalid_argument));
  EXPECT_NE(error_message(deep.error()).find("rank 17"), std::string::npos);

  // A bool tensor viewing foreign bytes that are not 0/1.
  uint8_t raw[3] = {1, 0, 5};
  auto foreign = at::from_blob(raw, {3}, at::kBool);
  auto bad_bool = to_blob(foreign);
  ASSERT_FALSE(bad_bool);
  EXPECT_NE(error_message(bad_bool.error()).find("index 2 has byte value 5"), std::string::npos);
}

TEST(TensorConvert, FromBlobRejectsInvalidBlobs) {
  auto check = [](const tensor_blob& x, const std::string& needle) {
    auto t = from_blob(x);
    ASSERT_FALSE(t) << "accepted a blob that should fail with " << needle;
    EXPECT_TRUE(is(t.error(), errc::invalid_argument));
    EXPECT_NE(error_message(t.error()).find(needle), std::string::npos) << error_message(t.error());
  };
  tensor_blob x;
  x.dtype = dtype::f32;
  x.shape = {2, 2};
  x.bytes = std::string(15, '\0');
  check(x, "holds 15 bytes");
  x.shape = {-2, 2};
  x.bytes.clear();
  check(x, "dimension 0 is negative (-2)");
  x.shape = {1};
  x.dtype = static_cast<dtype>(200);
  x.bytes = "abcd";
  check(x, "unknown dtype code 200");
  x.dtype = dtype::boolean;
  x.bytes = "\x03";
  check(x, "byte value 3");
  x.dtype = dtype::i64;
  x.shape = {int64_t{1} << 62, 4};
  x.bytes.clear();
  check(x, "overflows int64");
}

} // namespace
} // namespace rlforge::actors
