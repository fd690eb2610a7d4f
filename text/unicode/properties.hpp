#pragma once

#include <string>

/// The Unicode character properties the tokenizer pipeline needs, read from ICU's data (never from
/// tables of our own). Pure functions, safe to call from any thread.
namespace rlforge::text::unicode {

/// The White_Space property: what Rust's `char::is_whitespace`, Rust regex `\s` and Oniguruma's
/// `\s` (Hugging Face tokenizers) match.
bool is_white_space(char32_t c) noexcept;

/// Rust regex `\w`: Alphabetic, a mark (Mn, Mc, Me), a decimal digit (Nd), a connector (Pc) or
/// Join_Control. Added tokens with `single_word` look at it.
bool is_word_char(char32_t c) noexcept;

/// General category Mark (Mn, Mc, Me): what the StripAccents normalizer removes.
bool is_combining_mark(char32_t c) noexcept;

/// Appends the full lowercase mapping of `c` taken alone (no context such as Greek final sigma),
/// as Rust's `char::to_lowercase`, which the Lowercase normalizer applies character by character.
void append_lowercase(std::string& out, char32_t c);

} // namespace rlforge::text::unicode
