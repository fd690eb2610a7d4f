#include "text/unicode/normalization.hpp"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "text/error.hpp"

namespace rlforge::text::unicode {

namespace {

bool is_ascii(std::string_view s) noexcept {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80)
      return false;
  return true;
}

const icu::Normalizer2& instance(normal_form form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
  case normal_form::nfc:
    n = icu::Normalizer2::getNFCInstance(status);
    break;
  case normal_form::nfd:
    n = icu::Normalizer2::getNFDInstance(status);
    break;
  case normal_form::nfkc:
    n = icu::Normalizer2::getNFKCInstance(status);
    break;
  case normal_form::nfkd:
    n = icu::Normalizer2::getNFKDInstance(status);
    break;
  }
  if (U_FAILURE(status) || n == nullptr)
    fail(std::string("ICU has no ") + to_string(form) + " normalizer: " + u_errorName(status));
  return *n;
}

} // namespace

const char* to_string(normal_form form) noexcept {
  switch (form) {
  case normal_form::nfc:
    return "NFC";
  case normal_form::nfd:
    return "NFD";
  case normal_form::nfkc:
    return "NFKC";
  case normal_form::nfkd:
    return "NFKD";
  }
  return "NFC";
}

std::string normalize(std::string_view s, normal_form form) {
  if (is_ascii(s))
    return std::string(s);
  const icu::Normalizer2& n = instance(form);
  icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  UErrorCode status = U_ZERO_ERROR;
  if (n.isNormalizedUTF8(piece, status) && U_SUCCESS(status))
    return std::string(s);
  status = U_ZERO_ERROR;
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  icu::StringByteSink<std::string> sink(&out);
  n.normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status))
    fail(std::string(to_string(form)) + " normalization failed: " + u_errorName(status));
  return out;
}

} // namespace rlforge::text::unicode
