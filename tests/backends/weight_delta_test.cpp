#include "backends/weights/weight_delta.hpp"
#include "backends/weights/weight_delta_simd.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "tests/backends/test_support.hpp"

using namespace rlforge::backends;
using rlforge::backends::testing::expect_error;

namespace {

using bytes = std::vector<std::uint8_t>;

bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  bytes out(n);
  for (auto& b : out)
    b = static_cast<std::uint8_t>(gen());
  return out;
}

// `before` with `changed` elements (of `element_size` bytes, spread evenly) given new bits.
bytes with_changes(const bytes& before, std::size_t element_size, std::size_t changed) {
  auto after = before;
  const auto n = before.size() / element_size;
  for (std::size_t k = 0; k < changed; ++k) {
    const auto i = k * n / changed;
    for (std::size_t j = 0; j < element_size; ++j)
      after[i * element_size + j] ^= static_cast<std::uint8_t>(0x5a + j);
  }
  return after;
}

// Encodes one tensor's change as a bucket of its own and decodes it over `before`.
bytes round_trip(const bytes& before, const bytes& after, std::size_t element_size,
                 delta_choice* chosen = nullptr, bool in_place = false) {
  delta_tensor t{before.data(), after.data(), before.size(), element_size};
  std::vector<delta_choice> choices{choose_delta(t)};
  if (chosen)
    *chosen = choices[0];
  bytes wire(delta_bucket_bytes(choices));
  encode_delta_bucket({t}, choices, wire.data());
  if (in_place) {
    auto out = before;
    decode_delta_bucket(wire.data(), wire.size(),
                        {{out.data(), out.data(), out.size(), element_size}});
    return out;
  }
  bytes out(before.size(), 0xee);
  decode_delta_bucket(wire.data(), wire.size(),
                      {{before.data(), out.data(), out.size(), element_size}});
  return out;
}

} // namespace

TEST(WeightDelta, EveryEncodingReproducesTheNewBytesForEveryElementSize) {
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    const auto before = random_bytes(es * 1000 + 0, 7 + static_cast<std::uint32_t>(es));
    // 0 changed (indices, empty), 3 (indices), 400 (bitmap), every one (full).
    for (std::size_t changed : {0u, 3u, 400u, 1000u}) {
      const auto after = with_changes(before, es, changed);
      for (bool in_place : {false, true}) {
        delta_choice c;
        EXPECT_EQ(round_trip(before, after, es, &c, in_place), after)
            << "element size " << es << ", " << changed << " changed";
        EXPECT_EQ(c.changed, changed);
      }
    }
  }
}

TEST(WeightDelta, TheSmallestSectionWinsAndFullWinsTies) {
  const auto before = random_bytes(2 * 1024, 1); // 1024 bf16 elements
  delta_choice c;
  round_trip(before, before, 2, &c);
  EXPECT_EQ(c.encoding, delta_encoding::indices);
  EXPECT_EQ(c.bytes, 0u);
  round_trip(before, with_changes(before, 2, 10), 2, &c);
  EXPECT_EQ(c.encoding, delta_encoding::indices);
  EXPECT_EQ(c.bytes, 10u * (4 + 2));
  // 1024 elements: a bitmap is 128 bytes; indices cost 6 per change, the bitmap 2.
  round_trip(before, with_changes(before, 2, 100), 2, &c);
  EXPECT_EQ(c.encoding, delta_encoding::bitmap);
  EXPECT_EQ(c.bytes, 128u + 100u * 2);
  round_trip(before, with_changes(before, 2, 1024), 2, &c);
  EXPECT_EQ(c.encoding, delta_encoding::full);
  EXPECT_EQ(c.bytes, 2048u);
  // 960 changes: bitmap 128 + 1920 = 2048 bytes, the same as full: full.
  round_trip(before, with_changes(before, 2, 960), 2, &c);
  EXPECT_EQ(c.encoding, delta_encoding::full);
  EXPECT_STREQ(delta_encoding_name(delta_encoding::bitmap), "bitmap");
}

TEST(WeightDelta, ElementsAreComparedBitForBit) {
  // 0.0 vs -0.0 and two NaNs with different payloads compare equal as numbers, not as bits.
  std::vector<float> a{0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f};
  std::vector<float> b = a;
  b[0] = -0.0f;
  std::uint32_t nan_bits = 0x7fc00001u;
  std::memcpy(&b[1], &nan_bits, sizeof(nan_bits));
  bytes before(sizeof(float) * a.size()), after(before.size());
  std::memcpy(before.data(), a.data(), before.size());
  std::memcpy(after.data(), b.data(), after.size());
  delta_choice c;
  EXPECT_EQ(round_trip(before, after, 4, &c), after);
  EXPECT_EQ(c.changed, 2u);
}

TEST(WeightDelta, ABucketOfSeveralTensorsDecodesEachOverItsOwnBase) {
  const auto b1 = random_bytes(4 * 300, 2), b2 = random_bytes(2 * 50, 3), b3 = random_bytes(0, 4);
  const auto a1 = with_changes(b1, 4, 5), a2 = with_changes(b2, 2, 50), a3 = b3;
  std::vector<delta_tensor> ts{{b1.data(), a1.data(), b1.size(), 4},
                               {b2.data(), a2.data(), b2.size(), 2},
                               {b3.data(), a3.data(), 0, 4}};
  std::vector<delta_choice> cs;
  for (auto& t : ts)
    cs.push_back(choose_delta(t));
  EXPECT_EQ(cs[0].encoding, delta_encoding::indices);
  EXPECT_EQ(cs[1].encoding, delta_encoding::full);
  bytes wire(delta_bucket_bytes(cs));
  EXPECT_EQ(wire.size(), 3 * 8 + 5 * 8 + 100 + 0u);
  encode_delta_bucket(ts, cs, wire.data());
  bytes o1(b1.size()), o2(b2.size()), o3;
  decode_delta_bucket(wire.data(), wire.size(),
                      {{b1.data(), o1.data(), o1.size(), 4},
                       {b2.data(), o2.data(), o2.size(), 2},
                       {b3.data(), o3.data(), 0, 4}});
  EXPECT_EQ(o1, a1);
  EXPECT_EQ(o2, a2);
}

TEST(WeightDelta, MalformedBucketsAreRefusedNamingWhatIsWrong) {
  const auto before = random_bytes(4 * 256, 5);
  const auto after = with_changes(before, 4, 3);
  delta_tensor t{before.data(), after.data(), before.size(), 4};
  std::vector<delta_choice> cs{choose_delta(t)};
  ASSERT_EQ(cs[0].encoding, delta_encoding::indices);
  bytes wire(delta_bucket_bytes(cs));
  encode_delta_bucket({t}, cs, wire.data());
  bytes out(before.size());
  auto refused = [&](const bytes& w, const std::string& why) {
    expect_error(
        [&] {
          decode_delta_bucket(w.data(), w.size(), {{before.data(), out.data(), out.size(), 4}});
        },
        error_code::decode_error, {why});
  };
  auto with_entry = [&](std::uint64_t entry) {
    auto w = wire;
    std::memcpy(w.data(), &entry, 8);
    return w;
  };
  auto with_index = [&](std::size_t k, std::uint32_t i) {
    auto w = wire;
    std::memcpy(w.data() + 8 + 4 * k, &i, 4);
    return w;
  };
  refused(with_entry((std::uint64_t{7} << 56) | 3), "tensor 0 of the bucket: unknown encoding 7");
  refused(with_entry((std::uint64_t{1} << 56) | 257), "257 changed elements of 256");
  auto longer = wire;
  longer.push_back(0);
  refused(longer, "describes 32 bytes, the bucket has 33");
  refused(bytes(wire.begin(), wire.begin() + 4), "cannot hold the directory");
  refused(with_index(0, 256), "index 256 is out of range or not ascending");
  refused(with_index(1, 0), "index 0 is out of range or not ascending");
  // A bitmap whose bits disagree with its count.
  bytes bitmap(8 + 32 + 3 * 4, 0);
  const std::uint64_t entry = (std::uint64_t{2} << 56) | 3;
  std::memcpy(bitmap.data(), &entry, 8);
  bitmap[8] = 0x03; // two bits for three values
  refused(bitmap, "the bitmap marks 2 elements, its count says 3");
  bitmap[8] = 0x0f;
  refused(bitmap, "marks more elements than its count, 3");
  // Bad element sizes and mismatched lists are refused before anything is read.
  expect_error([&] { choose_delta({before.data(), after.data(), 6, 4}); },
               error_code::invalid_argument, {"not a multiple of the element size 4"});
  expect_error([&] { choose_delta({before.data(), after.data(), 6, 3}); },
               error_code::invalid_argument, {"element size 3 is not 1, 2, 4 or 8"});
  expect_error([&] { encode_delta_bucket({t, t}, cs, wire.data()); },
               error_code::invalid_argument, {"2 tensors but 1 choices"});
}

TEST(WeightDelta, TheAvx512KernelsWriteAndReadTheSameBytesAsThePortableLoops) {
  // Where the CPU lacks AVX-512 both runs take the portable loops; the round trips still count.
  for (std::size_t es : {2u, 4u}) {
    for (std::size_t elements : {64u, 1000u, 4096u + 13u}) {
      const auto before = random_bytes(es * elements, 11 + static_cast<std::uint32_t>(elements));
      for (std::size_t changed : {std::size_t{0}, std::size_t{3}, elements / 5, elements / 2, elements}) {
        const auto after = with_changes(before, es, changed);
        delta_tensor t{before.data(), after.data(), before.size(), es};
        // Force each encoding in turn, whether or not it is the smallest.
        for (auto e : {delta_encoding::indices, delta_encoding::bitmap}) {
          std::vector<delta_choice> cs{choose_delta(t)};
          cs[0].encoding = e;
          cs[0].bytes = e == delta_encoding::indices
                            ? cs[0].changed * (4 + es)
                            : (elements + 7) / 8 + cs[0].changed * es;
          bytes wire[2], out[2];
          for (int simd = 0; simd < 2; ++simd) {
            delta_simd::set_enabled(simd == 1);
            wire[simd].assign(delta_bucket_bytes(cs), 0);
            encode_delta_bucket({t}, cs, wire[simd].data());
            out[simd].assign(before.size(), 0xee);
            decode_delta_bucket(wire[simd].data(), wire[simd].size(),
                                {{before.data(), out[simd].data(), out[simd].size(), es}});
          }
          delta_simd::set_enabled(true);
          const auto what = std::to_string(es) + "-byte elements: " + std::to_string(changed) +
                            " of " + std::to_string(elements) + " changed, " +
                            delta_encoding_name(e);
          EXPECT_EQ(wire[0], wire[1]) << what;
          EXPECT_EQ(out[0], after) << what;
          EXPECT_EQ(out[1], after) << what;
        }
      }
    }
  }
}
