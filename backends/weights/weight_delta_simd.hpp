#pragma once

#include <cstddef>
#include <cstdint>

// AVX-512 kernels of the delta codec (weight_delta.hpp), for tensors of 2- and 4-byte elements
// (bf16, f16, fp32): 32 or 16 elements compared per instruction, the changed ones packed by a
// compress and unpacked by an expand. Internal to weight_delta.cpp, which falls back to its
// portable loops where the CPU lacks AVX-512 F, BW and VL (checked once, at run time) and for
// other element sizes. Both produce the same bytes (tested).
//
// Every range here covers whole blocks of 64 elements (`n` a multiple of 64), so the bitmap bytes
// a kernel writes line up with the portable code's, which goes on from element `n`.
namespace rlforge::backends::delta_simd {

/// Whether the kernels run: the CPU has them and `set_enabled(false)` did not turn them off.
bool enabled() noexcept;

/// Turns the kernels off, or back on where the CPU has them (for tests that compare them with
/// the portable code). Not thread-safe against concurrent encoding.
void set_enabled(bool on) noexcept;

/// Encodes elements [0, n) of `before`/`after` (`element_size` 2 or 4, `n` a multiple of 64):
/// with `bitmap`, writes the n / 8 bitmap bytes at `bits`; otherwise appends the changed
/// elements' uint32 indices at `index`. Appends the changed values at `value`. Advances `index`
/// and `value` past what it wrote.
void encode(std::size_t element_size, const std::uint8_t* before, const std::uint8_t* after,
            std::uint64_t n, bool bitmap, std::uint8_t* bits, std::uint8_t*& index,
            std::uint8_t*& value);

/// Decodes bitmap elements [0, n) (`element_size` 2 or 4, `n` a multiple of 64): element i of
/// `out` becomes the next value from `value` when bit i of `bits` is set, else element i of
/// `base` (`out` may equal `base`). Never reads a value at or past `end`: returns false at the
/// first block whose bits mark more values than remain (blocks before it are written). Advances
/// `value` past what it read.
bool decode_bitmap(std::size_t element_size, const std::uint8_t* base, std::uint8_t* out,
                   std::uint64_t n, const std::uint8_t* bits, const std::uint8_t*& value,
                   const std::uint8_t* end);

} // namespace rlforge::backends::delta_simd
