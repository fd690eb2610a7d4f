#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/hf/json_reader.hpp"
#include "text/unicode/regex.hpp"

/// The `pattern` of tokenizer.json's Split pre-tokenizer and Replace normalizer/decoder.
namespace rlforge::text::hf {

/// `{"String": s}` (matches s literally) or `{"Regex": r}` (Oniguruma syntax, see
/// `unicode::regex`). Immutable; `find_all` is safe to call from many threads at once.
class pattern {
public:
  /// Reads the pattern object at `where`; throws `tokenizer_error` naming what is wrong.
  static pattern from_json(const json& j, const std::string& where);

  /// Appends the matches in `text` (valid UTF-8), left to right and non-overlapping, as HF's
  /// regex iterator gives them (a literal is searched as the regex that escapes it).
  void find_all(std::string_view text, std::vector<unicode::match_span>& out) const;

  /// `String "..."` or `Regex "..."`, for messages.
  std::string describe() const;

private:
  std::string literal_;
  bool is_regex_ = false;
  std::optional<unicode::regex> regex_;
};

} // namespace rlforge::text::hf
