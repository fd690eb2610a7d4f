#include "backends/weights/weight_delta_simd.hpp"

#include <atomic>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 takes the intrinsics' deliberately undefined lanes (_mm512_undefined_*) for
// uninitialised values once they are inlined into this file's kernels.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define RLFORGE_DELTA_AVX512 1
#endif

namespace rlforge::backends::delta_simd {

namespace {

#ifdef RLFORGE_DELTA_AVX512
bool cpu_has_avx512() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}
#else
bool cpu_has_avx512() noexcept {
  return false;
}
#endif

std::atomic<bool>& switched_on() {
  static std::atomic<bool> on{true};
  return on;
}

/// The index encoding of one block: for each set bit j of `changed`, element `first + j`'s
/// uint32 index at `index` and its `size` bytes of `after` at `value`.
void append_indexed(std::uint32_t changed, std::uint64_t first, const std::uint8_t* after,
                    std::size_t size, std::uint8_t*& index, std::uint8_t*& value) {
  for (; changed != 0; changed &= changed - 1) {
    const auto i = first + static_cast<std::uint64_t>(__builtin_ctz(changed));
    const auto i32 = static_cast<std::uint32_t>(i);
    std::memcpy(index, &i32, sizeof(i32));
    index += sizeof(i32);
    std::memcpy(value, after + size * i, size);
    value += size;
  }
}

#ifdef RLFORGE_DELTA_AVX512

#define RLFORGE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/// The lowest `count` lanes of a 16-lane mask (count <= 16).
inline __mmask16 low_lanes(unsigned count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

RLFORGE_AVX512 void encode16(const std::uint8_t* before, const std::uint8_t* after,
                             std::uint64_t n, bool bitmap, std::uint8_t* bits,
                             std::uint8_t*& index, std::uint8_t*& value) {
  for (std::uint64_t i = 0; i < n; i += 32) {
    const __m512i a = _mm512_loadu_si512(after + 2 * i);
    const __m512i b = _mm512_loadu_si512(before + 2 * i);
    const __mmask32 m = _mm512_cmpneq_epi16_mask(a, b);
    if (bitmap) {
      const auto word = static_cast<std::uint32_t>(m);
      std::memcpy(bits + i / 8, &word, sizeof(word));
    }
    if (m == 0)
      continue;
    if (!bitmap) {
      append_indexed(static_cast<std::uint32_t>(m), i, after, 2, index, value);
      continue;
    }
    // The changed halves of each 16-lane half, widened to 32 bits, compressed, narrowed back.
    const auto lo = static_cast<__mmask16>(m), hi = static_cast<__mmask16>(m >> 16);
    const __m512i wide_lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(a));
    const __m512i wide_hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(a, 1));
    const auto n_lo = static_cast<unsigned>(__builtin_popcount(lo));
    const auto n_hi = static_cast<unsigned>(__builtin_popcount(hi));
    _mm512_mask_cvtepi32_storeu_epi16(value, low_lanes(n_lo),
                                      _mm512_maskz_compress_epi32(lo, wide_lo));
    value += 2 * n_lo;
    _mm512_mask_cvtepi32_storeu_epi16(value, low_lanes(n_hi),
                                      _mm512_maskz_compress_epi32(hi, wide_hi));
    value += 2 * n_hi;
  }
}

RLFORGE_AVX512 void encode32(const std::uint8_t* before, const std::uint8_t* after,
                             std::uint64_t n, bool bitmap, std::uint8_t* bits,
                             std::uint8_t*& index, std::uint8_t*& value) {
  for (std::uint64_t i = 0; i < n; i += 16) {
    const __m512i a = _mm512_loadu_si512(after + 4 * i);
    const __m512i b = _mm512_loadu_si512(before + 4 * i);
    const __mmask16 m = _mm512_cmpneq_epi32_mask(a, b);
    if (bitmap) {
      const auto word = static_cast<std::uint16_t>(m);
      std::memcpy(bits + i / 8, &word, sizeof(word));
    }
    if (m == 0)
      continue;
    if (!bitmap) {
      append_indexed(static_cast<std::uint32_t>(m), i, after, 4, index, value);
      continue;
    }
    const auto count = static_cast<unsigned>(__builtin_popcount(m));
    _mm512_mask_storeu_epi32(value, low_lanes(count), _mm512_maskz_compress_epi32(m, a));
    value += 4 * count;
  }
}

RLFORGE_AVX512 bool decode16(const std::uint8_t* base, std::uint8_t* out, std::uint64_t n,
                             const std::uint8_t* bits, const std::uint8_t*& value,
                             const std::uint8_t* end) {
  for (std::uint64_t i = 0; i < n; i += 32) {
    std::uint32_t m = 0;
    std::memcpy(&m, bits + i / 8, sizeof(m));
    const __m512i old = _mm512_loadu_si512(base + 2 * i);
    if (m == 0) {
      _mm512_storeu_si512(out + 2 * i, old);
      continue;
    }
    const auto lo = static_cast<__mmask16>(m), hi = static_cast<__mmask16>(m >> 16);
    const auto n_lo = static_cast<unsigned>(__builtin_popcount(lo));
    const auto n_hi = static_cast<unsigned>(__builtin_popcount(hi));
    if (static_cast<std::uint64_t>(end - value) < 2u * (n_lo + n_hi))
      return false;
    // Each half: the old elements widened to 32 bits, the next values expanded into the marked
    // lanes, narrowed back.
    const __m512i vals_lo =
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(low_lanes(n_lo), value));
    const __m512i vals_hi =
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(low_lanes(n_hi), value + 2 * n_lo));
    const __m512i old_lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(old));
    const __m512i old_hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(old, 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm512_cvtepi32_epi16(_mm512_mask_expand_epi32(old_lo, lo, vals_lo)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 32),
                        _mm512_cvtepi32_epi16(_mm512_mask_expand_epi32(old_hi, hi, vals_hi)));
    value += 2 * (n_lo + n_hi);
  }
  return true;
}

RLFORGE_AVX512 bool decode32(const std::uint8_t* base, std::uint8_t* out, std::uint64_t n,
                             const std::uint8_t* bits, const std::uint8_t*& value,
                             const std::uint8_t* end) {
  for (std::uint64_t i = 0; i < n; i += 16) {
    std::uint16_t m = 0;
    std::memcpy(&m, bits + i / 8, sizeof(m));
    const __m512i old = _mm512_loadu_si512(base + 4 * i);
    const auto count = static_cast<unsigned>(__builtin_popcount(m));
    if (static_cast<std::uint64_t>(end - value) < 4u * count)
      return false;
    const __m512i vals = _mm512_maskz_loadu_epi32(low_lanes(count), value);
    _mm512_storeu_si512(out + 4 * i, _mm512_mask_expand_epi32(old, m, vals));
    value += 4 * count;
  }
  return true;
}

#undef RLFORGE_AVX512

#endif // RLFORGE_DELTA_AVX512

} // namespace

bool enabled() noexcept {
  return cpu_has_avx512() && switched_on().load(std::memory_order_relaxed);
}

void set_enabled(bool on) noexcept {
  switched_on().store(on, std::memory_order_relaxed);
}

void encode(std::size_t element_size, const std::uint8_t* before, const std::uint8_t* after,
            std::uint64_t n, bool bitmap, std::uint8_t* bits, std::uint8_t*& index,
            std::uint8_t*& value) {
#ifdef RLFORGE_DELTA_AVX512
  if (element_size == 2)
    encode16(before, after, n, bitmap, bits, index, value);
  else
    encode32(before, after, n, bitmap, bits, index, value);
#else
  (void)element_size, (void)before, (void)after, (void)n, (void)bitmap, (void)bits, (void)index,
      (void)value;
#endif
}

bool decode_bitmap(std::size_t element_size, const std::uint8_t* base, std::uint8_t* out,
                   std::uint64_t n, const std::uint8_t* bits, const std::uint8_t*& value,
                   const std::uint8_t* end) {
#ifdef RLFORGE_DELTA_AVX512
  return element_size == 2 ? decode16(base, out, n, bits, value, end)
                           : decode32(base, out, n, bits, value, end);
#else
  (void)element_size, (void)base, (void)out, (void)n, (void)bits, (void)value, (void)end;
  return false;
#endif
}

} // namespace rlforge::backends::delta_simd
