#include "text/unicode/properties.hpp"

#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include "text/error.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::unicode {

bool is_white_space(char32_t c) noexcept {
  return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0;
}

bool is_word_char(char32_t c) noexcept {
  auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL))
    return true;
  switch (u_charType(cp)) {
  case U_NON_SPACING_MARK:
  case U_COMBINING_SPACING_MARK:
  case U_ENCLOSING_MARK:
  case U_DECIMAL_DIGIT_NUMBER:
  case U_CONNECTOR_PUNCTUATION:
    return true;
  default:
    return false;
  }
}

bool is_combining_mark(char32_t c) noexcept {
  switch (u_charType(static_cast<UChar32>(c))) {
  case U_NON_SPACING_MARK:
  case U_COMBINING_SPACING_MARK:
  case U_ENCLOSING_MARK:
    return true;
  default:
    return false;
  }
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c));
    return;
  }
  // One code point alone: ICU's root-locale full mapping without context, which is what Rust
  // applies per character (a lone capital sigma becomes σ, U+0130 becomes "i̇").
  UChar src[2];
  int32_t src_len = 0;
  U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(c));
  UChar dst[8];
  UErrorCode status = U_ZERO_ERROR;
  int32_t len = u_strToLower(dst, 8, src, src_len, "", &status);
  if (U_FAILURE(status) || len > 8)
    fail("Lowercase: ICU could not lowercase U+" + std::to_string(static_cast<uint32_t>(c)));
  for (int32_t i = 0; i < len;) {
    UChar32 cp;
    U16_NEXT(dst, i, len, cp);
    append_utf8(out, static_cast<char32_t>(cp));
  }
}

} // namespace rlforge::text::unicode
