#include "text/unicode/utf8.hpp"

#include <cstdint>
#include <cstring>

#include "text/error.hpp"

namespace rlforge::text::unicode {

namespace {

// The length of the valid prefix of the sequence that starts at s[i] (0 when s[i] cannot start a
// sequence), and whether that prefix is a complete character. The second-byte ranges are those
// of RFC 3629's grammar: they exclude overlong forms, surrogates and values above U+10FFFF.
struct sequence_check {
  size_t valid;
  bool complete;
};

sequence_check check_sequence(const unsigned char* p, size_t n) noexcept {
  unsigned char b0 = p[0];
  if (b0 < 0x80)
    return {1, true};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0)
      lo = 0xA0;
    else if (b0 == 0xED)
      hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0)
      lo = 0x90;
    else if (b0 == 0xF4)
      hi = 0x8F;
  } else {
    return {0, false};
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (k >= n)
      return {k, false};
    unsigned char b = p[k];
    unsigned char l = k == 1 ? lo : 0x80;
    unsigned char h = k == 1 ? hi : 0xBF;
    if (b < l || b > h)
      return {k, false};
  }
  return {need, true};
}

} // namespace

size_t find_invalid_utf8(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs dominate real text: test eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if (word & 0x8080808080808080ULL)
        break;
      i += 8;
    }
    if (i >= n)
      break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    auto c = check_sequence(p + i, n - i);
    if (!c.complete)
      return i;
    i += c.valid;
  }
  return std::string_view::npos;
}

void require_valid_utf8(std::string_view s, std::string_view what) {
  size_t at = find_invalid_utf8(s);
  if (at == std::string_view::npos)
    return;
  static const char* hex = "0123456789ABCDEF";
  auto b = static_cast<unsigned char>(s[at]);
  std::string byte = {'0', 'x', hex[b >> 4], hex[b & 15]};
  fail(std::string(what) + ": invalid UTF-8 at byte " + std::to_string(at) + " (" + byte + ")");
}

char32_t next_code_point(std::string_view s, size_t& i) noexcept {
  auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t len = sequence_length(b0);
  char32_t c = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k)
    c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return c;
}

char32_t last_code_point(std::string_view s) noexcept {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80)
    --i;
  return next_code_point(s, i);
}

std::string from_utf8_lossy(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    auto c = check_sequence(p + i, n - i);
    if (c.complete) {
      out.append(bytes.data() + i, c.valid);
      i += c.valid;
    } else {
      out.append(replacement_utf8);
      i += c.valid == 0 ? 1 : c.valid;
    }
  }
  return out;
}

size_t count_code_points(std::string_view s) noexcept {
  size_t count = 0;
  for (char ch : s)
    count += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return count;
}

} // namespace rlforge::text::unicode
