#pragma once

#include <string>
#include <string_view>

/// Unicode normalization forms (ICU's Normalizer2 on UTF-8). Safe to call from any thread.
namespace rlforge::text::unicode {

enum class normal_form { nfc, nfd, nfkc, nfkd };

/// "NFC", "NFD", "NFKC" or "NFKD".
const char* to_string(normal_form form) noexcept;

/// `s` (valid UTF-8) in normalization form `form`. ASCII text is returned as is without calling
/// ICU (it is invariant under every form).
std::string normalize(std::string_view s, normal_form form);

} // namespace rlforge::text::unicode
