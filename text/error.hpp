#pragma once

#include <stdexcept>
#include <string>

/// The one error type of rlforge::text (std only, no CAF, no torch).
namespace rlforge::text {

/// What every function of rlforge::text throws when it refuses its input: a missing, malformed or
/// unsupported tokenizer file (the message names the file, the JSON path and the offending type or
/// value), invalid UTF-8 text (the message names the byte offset), an id outside the vocabulary.
/// Nothing in the library aborts on bad input.
class tokenizer_error : public std::runtime_error {
public:
  explicit tokenizer_error(const std::string& message);
};

/// Throws `tokenizer_error(message)`.
[[noreturn]] void fail(const std::string& message);

} // namespace rlforge::text
