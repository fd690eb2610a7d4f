#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <memory>

#include "backends/model/detokenizer.hpp"

namespace rlforge::backends {

/// Watches the text of one generated row for stop strings (Tinker's `SamplingParams.stop` as
/// strings, vLLM's `stop`): the generated tokens are detokenized as they come (special tokens
/// included) and the row stops at the first token after which that text contains one of the
/// strings. The token that completed the string is part of the row; the text is never cut
/// inside a token.
///
/// Text is seen as the detokenizer's `token_text_stream` releases it: while the decoded tokens
/// end inside a UTF-8 character, nothing after the last complete one is looked at, so a stop
/// string ending in a multi-byte character matches at the token that completes that character.
/// A token that names no token of the tokenizer (a model vocabulary padded past its tokenizer)
/// adds no text.
///
/// The cost per token does not grow with the length of the generation: only the last
/// (longest stop string - 1) bytes of earlier text are kept, enough for a string spanning tokens.
///
/// One matcher per generated row; not thread-safe (one thread at a time). Its stream keeps the
/// tokenizer alive.
class stop_string_matcher {
public:
  /// Throws `backends::error(invalid_argument)` when `stops` is empty or holds an empty string
  /// (naming its index).
  stop_string_matcher(const detokenizer& tok, std::vector<std::string> stops);

  /// Appends the row's next token. Returns the index in `stop_strings()` of the stop string that
  /// the text completed with it, or nullopt. When several are completed by the same token, the
  /// one that ends first in the text wins, then the one that starts first, then the lower index.
  /// Only strings that end in the text this token released are reported: a string found once is
  /// not found again by later tokens.
  std::optional<size_t> push(int64_t id);

  const std::vector<std::string>& stop_strings() const { return stops_; }

private:
  std::unique_ptr<token_text_stream> stream_;
  std::vector<std::string> stops_;
  size_t keep_ = 0;  ///< bytes of earlier text a match may still need: longest stop - 1
  std::string tail_; ///< the last `keep_` (or fewer) bytes of the text released so far
};

} // namespace rlforge::backends
