#include "backends/weights/weight_delta.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "backends/error.hpp"
#include "backends/weights/weight_delta_simd.hpp"

namespace rlforge::backends {

namespace {

constexpr std::uint64_t count_mask = (std::uint64_t{1} << 56) - 1;
constexpr std::uint64_t directory_entry = sizeof(std::uint64_t);

template <class Word> Word load(const std::uint8_t* p) {
  Word w;
  std::memcpy(&w, p, sizeof(Word));
  return w;
}

template <class Word> std::uint64_t count_changed(const std::uint8_t* a, const std::uint8_t* b,
                                                  std::uint64_t n) {
  std::uint64_t changed = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    changed += load<Word>(a + i * sizeof(Word)) != load<Word>(b + i * sizeof(Word));
  return changed;
}

void check_element_size(std::size_t element_size, std::uint64_t bytes, const char* who) {
  if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8)
    fail(error_code::invalid_argument, std::string(who) + ": element size " +
                                           std::to_string(element_size) + " is not 1, 2, 4 or 8");
  if (bytes % element_size != 0)
    fail(error_code::invalid_argument, std::string(who) + ": " + std::to_string(bytes) +
                                           " bytes is not a multiple of the element size " +
                                           std::to_string(element_size));
}

std::uint64_t bitmap_bytes(std::uint64_t elements) {
  return (elements + 7) / 8;
}

std::uint64_t section_bytes(delta_encoding e, std::uint64_t changed, std::uint64_t bytes,
                            std::size_t element_size) {
  const auto elements = bytes / element_size;
  switch (e) {
  case delta_encoding::full:
    return bytes;
  case delta_encoding::indices:
    return changed * (sizeof(std::uint32_t) + element_size);
  case delta_encoding::bitmap:
    return bitmap_bytes(elements) + changed * element_size;
  }
  return bytes;
}

// Bit j of the result is set when element j of the 64 at `a` and `b` differs (`count` <= 64
// elements). Branch-free, so the compiler vectorises the comparisons.
template <class Word> std::uint64_t block_mask(const std::uint8_t* a, const std::uint8_t* b,
                                               std::uint64_t count) {
  std::uint64_t m = 0;
  for (std::uint64_t j = 0; j < count; ++j)
    m |= std::uint64_t{load<Word>(a + j * sizeof(Word)) != load<Word>(b + j * sizeof(Word))}
         << j;
  return m;
}

// Whether the AVX-512 kernels take whole 64-element blocks of tensors of `Word`.
template <class Word> bool simd_for() {
  return (sizeof(Word) == 2 || sizeof(Word) == 4) && delta_simd::enabled();
}

template <class Word> void encode_changes(const delta_tensor& t, delta_encoding e,
                                          std::uint64_t changed, std::uint8_t* out) {
  const auto n = t.bytes / sizeof(Word);
  auto* index = out;                                   // indices: the positions
  auto* bits = out;                                    // bitmap: the bits
  auto* value = out + (e == delta_encoding::indices ? changed * sizeof(std::uint32_t)
                                                    : bitmap_bytes(n));
  // The whole 64-element blocks by the AVX-512 kernels where they run; the rest here.
  std::uint64_t first = 0;
  if (simd_for<Word>()) {
    first = n / 64 * 64;
    delta_simd::encode(sizeof(Word), t.before, t.after, first, e == delta_encoding::bitmap, bits,
                       index, value);
  }
  // 64 elements at a time: their mask of changes, then the changed ones in order.
  for (std::uint64_t block = first; block < n; block += 64) {
    const auto count = std::min<std::uint64_t>(64, n - block);
    auto m = block_mask<Word>(t.before + block * sizeof(Word), t.after + block * sizeof(Word),
                              count);
    if (e == delta_encoding::bitmap) {
      // Little-endian bytes of the mask; the last block writes only the bytes it has.
      for (std::uint64_t k = 0; k < (count + 7) / 8; ++k)
        bits[block / 8 + k] = static_cast<std::uint8_t>(m >> (8 * k));
    }
    while (m != 0) {
      const auto j = static_cast<std::uint64_t>(__builtin_ctzll(m));
      m &= m - 1;
      const auto i = block + j;
      std::memcpy(value, t.after + i * sizeof(Word), sizeof(Word));
      value += sizeof(Word);
      if (e == delta_encoding::indices) {
        const auto i32 = static_cast<std::uint32_t>(i);
        std::memcpy(index, &i32, sizeof(i32));
        index += sizeof(i32);
      }
    }
  }
}

template <class F> auto by_word(std::size_t element_size, F&& f) {
  switch (element_size) {
  case 1:
    return f(std::uint8_t{});
  case 2:
    return f(std::uint16_t{});
  case 4:
    return f(std::uint32_t{});
  default:
    return f(std::uint64_t{});
  }
}

[[noreturn]] void bad(std::size_t position, const std::string& what) {
  fail(error_code::decode_error,
       "delta bucket: tensor " + std::to_string(position) + " of the bucket: " + what);
}

// Writes the changed values of section `in` (encoding `e`, `changed` of them) over `out`.
template <class Word> void apply_changes(const delta_target& t, delta_encoding e,
                                         std::uint64_t changed, const std::uint8_t* in,
                                         std::size_t position) {
  const auto n = t.bytes / sizeof(Word);
  if (e == delta_encoding::indices) {
    if (t.out != t.base)
      std::memcpy(t.out, t.base, t.bytes);
    const auto* value = in + changed * sizeof(std::uint32_t);
    std::int64_t last = -1;
    for (std::uint64_t k = 0; k < changed; ++k) {
      const auto i = load<std::uint32_t>(in + k * sizeof(std::uint32_t));
      if (static_cast<std::int64_t>(i) <= last || i >= n)
        bad(position, "index " + std::to_string(i) + " is out of range or not ascending (" +
                          std::to_string(n) + " elements)");
      last = i;
      std::memcpy(t.out + std::uint64_t{i} * sizeof(Word), value + k * sizeof(Word),
                  sizeof(Word));
    }
    return;
  }
  const auto* bits = in;
  const auto* value = in + bitmap_bytes(n);
  const auto* end = value + changed * sizeof(Word);
  // The whole 64-element blocks by the AVX-512 kernels where they run (they write every element
  // of a block, changed or not); the rest over a copy of the base.
  std::uint64_t first = 0;
  if (simd_for<Word>()) {
    first = n / 64 * 64;
    if (!delta_simd::decode_bitmap(sizeof(Word), t.base, t.out, first, bits, value, end))
      bad(position, "the bitmap marks more elements than its count, " + std::to_string(changed));
  }
  if (t.out != t.base)
    std::memcpy(t.out + first * sizeof(Word), t.base + first * sizeof(Word),
                (n - first) * sizeof(Word));
  for (std::uint64_t block = first; block < n; block += 64) {
    const auto count = std::min<std::uint64_t>(64, n - block);
    std::uint64_t m = 0;
    for (std::uint64_t k = 0; k < (count + 7) / 8; ++k)
      m |= std::uint64_t{bits[block / 8 + k]} << (8 * k);
    if (count < 64 && (m >> count) != 0)
      bad(position, "the bitmap marks element " +
                        std::to_string(block + 64 - static_cast<std::uint64_t>(
                                                      __builtin_clzll(m))) +
                        " of " + std::to_string(n));
    const auto marked = static_cast<std::uint64_t>(__builtin_popcountll(m));
    if (marked * sizeof(Word) > static_cast<std::uint64_t>(end - value))
      bad(position, "the bitmap marks more elements than its count, " +
                        std::to_string(changed));
    while (m != 0) {
      const auto j = static_cast<std::uint64_t>(__builtin_ctzll(m));
      m &= m - 1;
      std::memcpy(t.out + (block + j) * sizeof(Word), value, sizeof(Word));
      value += sizeof(Word);
    }
  }
  if (value != end)
    bad(position, "the bitmap marks " +
                      std::to_string(changed - static_cast<std::uint64_t>(end - value) /
                                                   sizeof(Word)) +
                      " elements, its count says " + std::to_string(changed));
}

} // namespace

const char* delta_encoding_name(delta_encoding e) noexcept {
  switch (e) {
  case delta_encoding::full:
    return "full";
  case delta_encoding::indices:
    return "indices";
  case delta_encoding::bitmap:
    return "bitmap";
  }
  return "unknown";
}

delta_choice choose_delta(const delta_tensor& t) {
  check_element_size(t.element_size, t.bytes, "delta encoding");
  const auto n = t.bytes / t.element_size;
  delta_choice c;
  c.changed = by_word(t.element_size, [&](auto word) {
    return count_changed<decltype(word)>(t.before, t.after, n);
  });
  c.bytes = t.bytes;
  auto consider = [&](delta_encoding e) {
    auto b = section_bytes(e, c.changed, t.bytes, t.element_size);
    if (b < c.bytes) {
      c.bytes = b;
      c.encoding = e;
    }
  };
  if (n <= std::uint64_t{std::numeric_limits<std::uint32_t>::max()} + 1)
    consider(delta_encoding::indices);
  consider(delta_encoding::bitmap);
  return c;
}

std::uint64_t delta_bucket_bytes(const std::vector<delta_choice>& choices) {
  std::uint64_t n = choices.size() * directory_entry;
  for (const auto& c : choices)
    n += c.bytes;
  return n;
}

void encode_delta_bucket(const std::vector<delta_tensor>& tensors,
                         const std::vector<delta_choice>& choices, std::uint8_t* out) {
  if (tensors.size() != choices.size())
    fail(error_code::invalid_argument, "delta encoding: " + std::to_string(tensors.size()) +
                                           " tensors but " + std::to_string(choices.size()) +
                                           " choices");
  auto* section = out + tensors.size() * directory_entry;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = tensors[k];
    const auto& c = choices[k];
    const std::uint64_t entry = (std::uint64_t{static_cast<std::uint8_t>(c.encoding)} << 56) |
                                (c.changed & count_mask);
    std::memcpy(out + k * directory_entry, &entry, sizeof(entry));
    if (t.bytes == 0) // an empty tensor: its directory entry only (no pointer is read)
      continue;
    if (c.encoding == delta_encoding::full)
      std::memcpy(section, t.after, t.bytes);
    else if (c.changed > 0)
      by_word(t.element_size, [&](auto word) {
        encode_changes<decltype(word)>(t, c.encoding, c.changed, section);
        return 0;
      });
    else if (c.encoding == delta_encoding::bitmap)
      std::memset(section, 0, bitmap_bytes(t.bytes / t.element_size));
    section += c.bytes;
  }
}

void decode_delta_bucket(const std::uint8_t* encoded, std::uint64_t encoded_bytes,
                         const std::vector<delta_target>& targets) {
  // The directory and the section sizes first: nothing is written from a bucket whose sizes do
  // not add up.
  struct entry {
    delta_encoding encoding;
    std::uint64_t changed;
    std::uint64_t bytes;
  };
  std::vector<entry> entries;
  entries.reserve(targets.size());
  const std::uint64_t directory = targets.size() * directory_entry;
  if (encoded_bytes < directory)
    fail(error_code::decode_error, "delta bucket: " + std::to_string(encoded_bytes) +
                                       " bytes cannot hold the directory of " +
                                       std::to_string(targets.size()) + " tensors");
  std::uint64_t total = directory;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    const auto& t = targets[k];
    check_element_size(t.element_size, t.bytes, "delta decoding");
    const auto word = load<std::uint64_t>(encoded + k * directory_entry);
    const auto code = static_cast<std::uint8_t>(word >> 56);
    if (code > static_cast<std::uint8_t>(delta_encoding::bitmap))
      bad(k, "unknown encoding " + std::to_string(code));
    entry e{static_cast<delta_encoding>(code), word & count_mask, 0};
    const auto elements = t.bytes / t.element_size;
    if (e.changed > elements)
      bad(k, std::to_string(e.changed) + " changed elements of " + std::to_string(elements));
    e.bytes = section_bytes(e.encoding, e.changed, t.bytes, t.element_size);
    total += e.bytes;
    entries.push_back(e);
  }
  if (total != encoded_bytes)
    fail(error_code::decode_error, "delta bucket: its directory describes " +
                                       std::to_string(total) + " bytes, the bucket has " +
                                       std::to_string(encoded_bytes));
  const auto* section = encoded + directory;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    const auto& t = targets[k];
    const auto& e = entries[k];
    if (t.bytes == 0)
      continue; // no section, nothing to write
    if (e.encoding == delta_encoding::full) {
      std::memcpy(t.out, section, t.bytes);
    } else { // each encoding copies the base where it needs to
      by_word(t.element_size, [&](auto word) {
        apply_changes<decltype(word)>(t, e.encoding, e.changed, section, k);
        return 0;
      });
    }
    section += e.bytes;
  }
}

} // namespace rlforge::backends
