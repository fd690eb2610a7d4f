#include "text/unicode/byte_level.hpp"

#include <array>

#include "text/unicode/utf8.hpp"

namespace rlforge::text::unicode {

namespace {

// The highest character of the alphabet: 0x100 + the number of bytes that are not printable.
constexpr char32_t max_char = 0x143;

struct tables {
  std::array<char32_t, 256> to_char{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, max_char + 1> to_byte{};

  tables() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b)
      to_char[b] = printable(b) ? static_cast<char32_t>(b) : next++;
    to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      append_utf8(to_utf8[b], to_char[b]);
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const tables& get() {
  static const tables t;
  return t;
}

} // namespace

char32_t byte_to_char(uint8_t b) noexcept {
  return get().to_char[b];
}

std::string_view byte_to_utf8(uint8_t b) noexcept {
  return get().to_utf8[b];
}

int char_to_byte(char32_t c) noexcept {
  return c <= max_char ? get().to_byte[c] : -1;
}

void append_byte_level(std::string& out, std::string_view raw) {
  const auto& t = get();
  for (char c : raw)
    out.append(t.to_utf8[static_cast<unsigned char>(c)]);
}

} // namespace rlforge::text::unicode
