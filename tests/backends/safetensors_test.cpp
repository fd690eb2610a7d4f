#include "backends/model/safetensors.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/safetensors_header.hpp"
#include "test_support.hpp"
#include "tests/support/raw_bytes.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
namespace fs = std::filesystem;

namespace {
using rlforge::test_support::raw_byte_vector;

std::vector<uint8_t> le64(uint64_t x) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<uint8_t>(x >> (8 * i));
  return out;
}

/// A file image: little-endian length, the JSON text as given, then `data`.
std::vector<uint8_t> file_bytes(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  auto prefix = le64(header.size());
  std::copy(prefix.begin(), prefix.end(), out.begin());
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return out;
}

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_size) {
  return file_bytes(header, std::vector<uint8_t>(data_size, 0xab));
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

safetensors_header parse(const std::vector<uint8_t>& bytes) {
  return parse_safetensors_header(bytes.data(), bytes.size(), bytes.size());
}


} // namespace

TEST(Safetensors, ReadsAHandBuiltFile) {
  temp_dir dir;
  // Written by hand from the published layout, deliberately unpadded and in non-sorted order.
  std::string header = R"({"b":{"dtype":"I64","shape":[3],"data_offsets":[16,40]},)"
                       R"("__metadata__":{"format":"pt","note":"hand"},)"
                       R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                       R"("e":{"dtype":"F16","shape":[0,5],"data_offsets":[40,40]}})";
  std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f};
  std::vector<int64_t> b{7, -9, int64_t{1} << 40};
  auto data = raw_byte_vector(a);
  auto bdata = raw_byte_vector(b);
  data.insert(data.end(), bdata.begin(), bdata.end());
  write_bytes(dir.file("x.safetensors"), file_bytes(header, data));

  auto h = read_safetensors_header(dir.file("x.safetensors"));
  EXPECT_EQ(h.data_offset, 8 + header.size());
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].begin, 16u);
  EXPECT_EQ(h.tensors[1].end, 40u);

  auto f = read_safetensors_file(dir.file("x.safetensors"));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hand"}}));
  ASSERT_EQ(f.tensors.size(), 3u);
  const auto& ta = f.tensors.at("a");
  EXPECT_EQ(ta.scalar_type(), at::kFloat);
  EXPECT_EQ(ta.sizes().vec(), (std::vector<int64_t>{2, 2}));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(ta.view(-1)[i].item<float>(), a[static_cast<size_t>(i)]);
  const auto& tb = f.tensors.at("b");
  EXPECT_EQ(tb.scalar_type(), at::kLong);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(tb[i].item<int64_t>(), b[static_cast<size_t>(i)]);
  EXPECT_EQ(f.tensors.at("e").scalar_type(), at::kHalf);
  EXPECT_EQ(f.tensors.at("e").sizes().vec(), (std::vector<int64_t>{0, 5}));
}

TEST(Safetensors, RoundTripIsBitExactForEveryDtype) {
  temp_dir dir;
  at::manual_seed(7);
  const std::vector<int64_t> shape{3, 5, 7};
  std::map<std::string, at::Tensor> tensors;
  // Random bit patterns cover NaN payloads, infinities, signed zeros and subnormals.
  tensors["f64"] = at::randint(std::numeric_limits<int64_t>::min() / 2,
                               std::numeric_limits<int64_t>::max() / 2, shape, at::kLong)
                       .view(at::kDouble);
  tensors["f32"] = at::randint(std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max(), shape, at::kInt)
                       .view(at::kFloat);
  tensors["f16"] = at::randint(-32768, 32767, shape, at::kShort).view(at::kHalf);
  tensors["bf16"] = at::randint(-32768, 32767, shape, at::kShort).view(at::kBFloat16);
  tensors["i64"] = at::randint(std::numeric_limits<int64_t>::min() / 2,
                               std::numeric_limits<int64_t>::max() / 2, shape, at::kLong);
  tensors["i32"] = at::randint(std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max(), shape, at::kInt);
  tensors["i16"] = at::randint(-32768, 32767, shape, at::kShort);
  tensors["i8"] = at::randint(-128, 127, shape, at::kChar);
  tensors["u8"] = at::randint(0, 255, shape, at::kByte);
  tensors["bool"] = at::randint(0, 2, shape, at::kLong).to(at::kBool);
  tensors["scalar"] = at::scalar_tensor(-0.0, at::kFloat);
  tensors["empty"] = at::empty({0, 4}, at::kBFloat16);
  tensors["special"] = at::tensor({std::numeric_limits<float>::infinity(), -0.0f,
                                   std::numeric_limits<float>::denorm_min(),
                                   std::numeric_limits<float>::quiet_NaN()});
  std::map<std::string, std::string> metadata{{"format", "pt"}, {"step", "12"}};
  write_safetensors(dir.file("all.safetensors"), tensors, metadata);

  auto back = read_safetensors_file(dir.file("all.safetensors"));
  EXPECT_EQ(back.metadata, metadata);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    EXPECT_TRUE(same_bits(t, back.tensors.at(name))) << name;
  }
  EXPECT_EQ(back.tensors.at("f64").scalar_type(), at::kDouble);
  EXPECT_EQ(back.tensors.at("bf16").scalar_type(), at::kBFloat16);
  EXPECT_EQ(back.tensors.at("bool").scalar_type(), at::kBool);
  EXPECT_EQ(back.tensors.at("scalar").dim(), 0);
}

TEST(Safetensors, ReadsTensorsIntoAnotherDtypePieceByPiece) {
  temp_dir dir;
  // 3M fp32 elements (12 MiB) cross the reader's 8 MiB pieces; a tensor kept as stored, an
  // empty one and a bf16-stored one kept as fp32 come along.
  std::map<std::string, at::Tensor> tensors{
      {"big", at::randn({3, 1000, 1000}, at::kFloat)},
      {"norm", at::randn({17}, at::kFloat)},
      {"empty", at::empty({0, 4}, at::kFloat)},
      {"stored_bf16", at::randn({5, 3}, at::kFloat).to(at::kBFloat16)}};
  const auto path = dir.file("x.safetensors");
  write_safetensors(path, tensors);
  auto got = read_safetensors(path, [](const std::string& name, at::ScalarType stored) {
    if (name == "norm")
      return stored;
    return name == "stored_bf16" ? at::kFloat : at::kBFloat16;
  });
  ASSERT_EQ(got.size(), tensors.size());
  EXPECT_EQ(got.at("big").scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.at("big").sizes(), tensors.at("big").sizes());
  EXPECT_TRUE(at::equal(got.at("big"), tensors.at("big").to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(got.at("norm"), tensors.at("norm")));
  EXPECT_EQ(got.at("empty").scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.at("empty").sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(at::equal(got.at("stored_bf16"), tensors.at("stored_bf16").to(at::kFloat)));
}

TEST(Safetensors, WrittenFileFollowsThePublishedLayout) {
  temp_dir dir;
  std::map<std::string, at::Tensor> tensors{
      {"zeta", at::arange(5, at::kInt)},
      {"alpha", at::arange(3, at::kDouble)},
      {"mid", at::ones({2, 3}, at::kHalf)},
  };
  write_safetensors(dir.file("t.safetensors"), tensors, {{"format", "pt"}});
  auto bytes = read_bytes(dir.file("t.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | bytes[static_cast<size_t>(i)];
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  std::string text(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  auto last = text.find_last_not_of(' ');
  EXPECT_EQ(text[last], '}');
  EXPECT_LT(text.size() - last - 1, 8u) << "padding is fewer than 8 spaces";
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("__metadata__").at("format"), "pt");
  // Data is laid out in sorted name order.
  EXPECT_EQ(j.at("alpha").at("data_offsets"), nlohmann::json({0, 24}));
  EXPECT_EQ(j.at("mid").at("data_offsets"), nlohmann::json({24, 36}));
  EXPECT_EQ(j.at("zeta").at("data_offsets"), nlohmann::json({36, 56}));
  EXPECT_EQ(j.at("mid").at("dtype"), "F16");
  EXPECT_EQ(j.at("mid").at("shape"), nlohmann::json({2, 3}));
  EXPECT_EQ(bytes.size(), 8 + n + 56);
  int32_t z[5];
  std::memcpy(z, bytes.data() + 8 + n + 36, sizeof(z));
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(z[i], i);
}

TEST(Safetensors, StoresViewsAndNonContiguousTensorsByValue) {
  temp_dir dir;
  auto base = at::arange(24, at::kFloat).view({4, 6});
  std::map<std::string, at::Tensor> tensors{
      {"transposed", base.t()},
      {"slice", base.slice(0, 1, 3).slice(1, 2, 5)},
      {"offset_view", base.view(-1).slice(0, 5, 11)},
  };
  write_safetensors(dir.file("v.safetensors"), tensors);
  auto back = read_safetensors(dir.file("v.safetensors"));
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(at::equal(back.at(name), t)) << name;
    EXPECT_TRUE(back.at(name).is_contiguous()) << name;
  }
}

TEST(Safetensors, OverwritesAtomicallyAndLeavesNoTemporaryFiles) {
  temp_dir dir;
  write_safetensors(dir.file("w.safetensors"), {{"x", at::zeros({3})}});
  write_safetensors(dir.file("w.safetensors"), {{"y", at::ones({2}, at::kLong)}});
  auto back = read_safetensors(dir.file("w.safetensors"));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(at::equal(back.at("y"), at::ones({2}, at::kLong)));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "w.safetensors");
  }
  EXPECT_EQ(files, 1u);
}

TEST(Safetensors, WriteRejectsBadInputsNamingThem) {
  temp_dir dir;
  auto expect = [&](const std::map<std::string, at::Tensor>& tensors, error_code code,
                    const std::string& needle) {
    try {
      write_safetensors(dir.file("bad.safetensors"), tensors);
      FAIL() << "expected an error mentioning " << needle;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect({{"undef_tensor", at::Tensor()}}, error_code::invalid_argument, "undef_tensor");
  expect({{"cplx", at::zeros({2}, at::kComplexFloat)}}, error_code::invalid_argument, "cplx");
  expect({{"", at::zeros({2})}}, error_code::invalid_argument, "empty");
  expect({{"__metadata__", at::zeros({2})}}, error_code::invalid_argument, "__metadata__");
  EXPECT_FALSE(fs::exists(dir.file("bad.safetensors")));
  try {
    write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"x", at::zeros({1})}});
    FAIL() << "expected io_error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::io_error);
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.safetensors"), std::string::npos)
        << e.what();
  }
}

TEST(Safetensors, ReadReportsMissingFilesAndDirectoriesNamingThePath) {
  temp_dir dir;
  try {
    read_safetensors(dir.file("absent.safetensors"));
    FAIL() << "expected not_found";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::not_found);
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos) << e.what();
  }
  try {
    read_safetensors(dir.path().string());
    FAIL() << "expected io_error for a directory";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::io_error);
  }
  write_bytes(dir.file("short.safetensors"), {1, 2, 3});
  try {
    read_safetensors(dir.file("short.safetensors"));
    FAIL() << "expected decode_error";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::decode_error);
    EXPECT_NE(std::string(e.what()).find("short.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shorter than"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsHeader, RejectsEachKindOfCorruptionWithAMessageNamingIt) {
  struct bad_case {
    std::string header;
    size_t data_size;
    std::string needle;
  };
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<bad_case> cases = {
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, "not valid JSON"},
      {R"(["t"])", 0, "does not start with '{'"},
      {R"( {})", 0, "does not start with '{'"},
      {R"({"t":[1,2]})", 8, "is not an object"},
      {R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8, "no 'dtype'"},
      {R"({"t":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8, "'dtype' that is not a string"},
      {R"({"t":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2, "unknown dtype 'F8'"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8, "no 'shape'"},
      {R"({"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8,
       "'shape' that is not an array"},
      {R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "negative dimension -2"},
      {R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8, "not an integer"},
      {R"({"t":{"dtype":"F32","shape":[2]}})", 8, "no 'data_offsets'"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "not a [begin, end] pair"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", 8, "negative data offset"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end is before its begin"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "out of range"},
      {R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12 bytes"},
      {R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8,
       "overflows"},
      {R"({"t":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8,
       "too large"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12, "hole of 4 bytes"},
      {"{" + ok_entry + "}", 12, "4 bytes after the last tensor"},
      {"{" + ok_entry + "," + ok_entry + "}", 8, "duplicate key 't'"},
      {"{" + ok_entry + R"(,"__metadata__":[1]})", 8, "'__metadata__' is not an object"},
      {"{" + ok_entry + R"(,"__metadata__":{"k":1}})", 8, "metadata value for 'k'"},
      {R"({"t":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", 8, "deeper than"},
      {"{\"t\":" + std::string(5000, '[') + std::string(5000, ']') + "}", 0, "deeper than"},
  };
  for (const auto& c : cases) {
    auto bytes = file_bytes(c.header, c.data_size);
    try {
      parse(bytes);
      ADD_FAILURE() << "accepted: " << c.header;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::decode_error) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos)
          << "message: " << e.what() << "\nexpected to mention: " << c.needle;
    }
  }
}

TEST(SafetensorsHeader, RejectsBadLengthPrefixes) {
  auto expect = [](const std::vector<uint8_t>& bytes, const std::string& needle) {
    try {
      parse(bytes);
      ADD_FAILURE() << "accepted a file of " << bytes.size() << " bytes";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::decode_error) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect({}, "shorter than the 8-byte");
  expect({1, 0, 0}, "shorter than the 8-byte");
  expect(le64(0), "does not start with '{'");
  auto past = le64(100);
  past.push_back('{');
  expect(past, "runs past the end");
  expect(le64(max_safetensors_header_bytes + 1), "exceeds the limit");
  expect(le64(std::numeric_limits<uint64_t>::max()), "exceeds the limit");
}

TEST(SafetensorsHeader, RejectsInconsistentBufferArguments) {
  auto bytes = file_bytes("{}", 0);
  auto expect_invalid = [](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "expected invalid_argument";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::invalid_argument) << e.what();
    }
  };
  expect_invalid([&] { parse_safetensors_header(bytes.data(), bytes.size(), bytes.size() - 1); });
  expect_invalid([&] { parse_safetensors_header(bytes.data(), 9, bytes.size()); });
  expect_invalid([&] { parse_safetensors_header(nullptr, 0, bytes.size()); });
  EXPECT_NO_THROW(parse_safetensors_header(bytes.data(), bytes.size(), bytes.size()));
  // The data section need not be provided.
  auto with_data = file_bytes(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4);
  auto h = parse_safetensors_header(with_data.data(), with_data.size() - 4, with_data.size());
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].end, 4u);
}

TEST(SafetensorsHeader, EncodeThenParseGivesTheEntriesBack) {
  std::vector<tensor_entry> entries{
      {"w", "BF16", {3, 4}, 0, 24},
      {"b", "I8", {5}, 24, 29},
      {"s", "F64", {}, 29, 37},
  };
  auto prefix = encode_safetensors_header(entries, {{"k", "v"}});
  EXPECT_EQ(prefix.size() % 8, 0u);
  std::vector<uint8_t> bytes(prefix.begin(), prefix.end());
  bytes.resize(bytes.size() + 37);
  auto h = parse(bytes);
  EXPECT_EQ(h.data_offset, prefix.size());
  EXPECT_EQ(h.metadata.at("k"), "v");
  ASSERT_EQ(h.tensors.size(), 3u);
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(h.tensors[i].name, entries[i].name);
    EXPECT_EQ(h.tensors[i].dtype, entries[i].dtype);
    EXPECT_EQ(h.tensors[i].shape, entries[i].shape);
    EXPECT_EQ(h.tensors[i].begin, entries[i].begin);
    EXPECT_EQ(h.tensors[i].end, entries[i].end);
  }
  EXPECT_THROW(encode_safetensors_header({{"x", "Q4", {1}, 0, 1}}, {}), error);
  EXPECT_THROW(encode_safetensors_header({{"x", "U8", {1}, 0, 1}, {"x", "U8", {1}, 1, 2}}, {}),
               error);
}

TEST(SafetensorsHeader, DtypeSizesMatchTheFormat) {
  EXPECT_EQ(safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("F32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("F16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("I64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("I32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("I16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("I8"), 1u);
  EXPECT_EQ(safetensors_dtype_size("U8"), 1u);
  EXPECT_EQ(safetensors_dtype_size("BOOL"), 1u);
  EXPECT_FALSE(is_safetensors_dtype("f32"));
  try {
    safetensors_dtype_size("C64");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::decode_error);
    EXPECT_NE(std::string(e.what()).find("C64"), std::string::npos);
  }
  EXPECT_EQ(scalar_type_of_safetensors_dtype("BF16"), at::kBFloat16);
  EXPECT_EQ(safetensors_dtype_of(at::kBool), "BOOL");
  EXPECT_THROW(safetensors_dtype_of(at::kComplexDouble), error);
}

TEST(SafetensorsHeader, RandomMutationsEitherParseConsistentlyOrThrowBackendErrors) {
  temp_dir dir;
  std::vector<tensor_entry> entries{
      {"a.weight", "F32", {4, 3}, 0, 48}, {"a.bias", "F16", {3}, 48, 54}, {"b", "I64", {2}, 54, 70},
      {"flag", "BOOL", {}, 70, 71},       {"z", "BF16", {0}, 71, 71},
  };
  auto prefix = encode_safetensors_header(entries, {{"format", "pt"}});
  std::vector<uint8_t> valid(prefix.begin(), prefix.end());
  for (int i = 0; i < 71; ++i)
    valid.push_back(static_cast<uint8_t>(i * 37));
  ASSERT_NO_THROW(parse(valid));

  std::mt19937_64 rng(20240611);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  size_t accepted = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    auto bytes = valid;
    switch (iter % 6) {
    case 0: // a few bit flips anywhere
      for (int k = 0, n = 1 + static_cast<int>(pick(4)); k < n; ++k)
        bytes[pick(bytes.size())] ^= static_cast<uint8_t>(1u << pick(8));
      break;
    case 1: // truncation
      bytes.resize(pick(bytes.size()));
      break;
    case 2: { // header length changes, small and wild
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i)
        n = (n << 8) | bytes[static_cast<size_t>(i)];
      n = pick(2) ? n + static_cast<uint64_t>(pick(17)) - 8 : rng();
      auto p = le64(n);
      std::copy(p.begin(), p.end(), bytes.begin());
      break;
    }
    case 3: // random byte in the JSON text
      bytes[8 + pick(prefix.size() - 8)] = static_cast<uint8_t>(rng());
      break;
    case 4: // a byte inserted or removed inside the header
      if (pick(2))
        bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(8 + pick(prefix.size() - 8)),
                     static_cast<uint8_t>(rng()));
      else
        bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(8 + pick(prefix.size() - 8)));
      break;
    case 5: // a digit of some number replaced by another digit
      for (size_t tries = 0; tries < 64; ++tries) {
        size_t at = 8 + pick(prefix.size() - 8);
        if (bytes[at] >= '0' && bytes[at] <= '9') {
          bytes[at] = static_cast<uint8_t>('0' + pick(10));
          break;
        }
      }
      break;
    }
    try {
      auto h = parse(bytes);
      ++accepted;
      // Whatever parses must describe a file the reader can safely use.
      uint64_t covered = 0;
      for (const auto& t : h.tensors) {
        EXPECT_EQ(t.begin, covered);
        uint64_t n = safetensors_dtype_size(t.dtype);
        for (auto d : t.shape)
          n *= static_cast<uint64_t>(d);
        EXPECT_EQ(t.end - t.begin, n);
        covered = t.end;
      }
      EXPECT_EQ(h.data_offset + covered, bytes.size());
      auto again = parse(bytes);
      EXPECT_EQ(again.tensors.size(), h.tensors.size());
      if (iter % 10 == 0) {
        write_bytes(dir.file("m.safetensors"), bytes);
        EXPECT_EQ(read_safetensors(dir.file("m.safetensors")).size(), h.tensors.size());
      }
    } catch (const error& e) {
      ++rejected;
      EXPECT_EQ(e.code(), error_code::decode_error) << e.what();
      if (iter % 10 == 0) {
        write_bytes(dir.file("m.safetensors"), bytes);
        EXPECT_THROW(read_safetensors(dir.file("m.safetensors")), error);
      }
    }
  }
  // Both outcomes must occur, or the mutations are not exercising the parser.
  EXPECT_GT(accepted, 100u);
  EXPECT_GT(rejected, 1000u);
}
