/// Stop-string references for the generation tests (sampler_test.cpp, continuous_engine_test.cpp):
/// the tokenizer `rlforge init-model` writes for the tiny preset's 512 ids, where a row with stop
/// strings must end (computed by decoding whole prefixes, not by the library's matcher), and a
/// stop string picked from a generated text.
///
/// Header-only; every function is safe to call from one thread at a time.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/model/text_detokenizer.hpp"
#include "text/model_tokenizer.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::backends::testing {

/// The tokenizer of a tiny-preset model directory (trained once per process): every one of the
/// 512 ids names a token.
inline const text::tokenizer& tiny_tokenizer() {
  static const text::tokenizer tok = [] {
    auto files = text::train_model_tokenizer(512);
    return text::tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json);
  }();
  return tok;
}

/// `tiny_tokenizer` as the engines take it (sampling_params::tokenizer).
inline const std::shared_ptr<const detokenizer>& tiny_detokenizer() {
  static const std::shared_ptr<const detokenizer> tok = make_detokenizer(tiny_tokenizer());
  return tok;
}

/// Whether `s` ends in U+FFFD (a character that is not complete yet, or an invalid byte).
inline bool ends_in_replacement(const std::string& s) {
  const std::string r = "\xEF\xBF\xBD";
  return s.size() >= r.size() && s.compare(s.size() - r.size(), r.size(), r) == 0;
}

/// The text of `tokens[0, k)`, special tokens included.
inline std::string prefix_text(const text::tokenizer& tok, const std::vector<int64_t>& tokens,
                               size_t k) {
  return tok.decode(std::vector<int64_t>(tokens.begin(), tokens.begin() + k), false);
}

/// How many tokens a row generating `tokens` keeps when it stops on any of `stops`: the least k
/// whose prefix text contains one of them, prefixes that end inside a character (in U+FFFD) not
/// counting as seen yet; nullopt when none does.
inline std::optional<size_t> stop_cut(const text::tokenizer& tok,
                                      const std::vector<int64_t>& tokens,
                                      const std::vector<std::string>& stops) {
  for (size_t k = 1; k <= tokens.size(); ++k) {
    auto text = prefix_text(tok, tokens, k);
    if (ends_in_replacement(text))
      continue;
    for (const auto& s : stops)
      if (text.find(s) != std::string::npos)
        return k;
  }
  return std::nullopt;
}

/// A stop string of `length` printable ASCII bytes that the text of `tokens` completes at a
/// token k >= `from` whose own new text is shorter than the string (so the string spans at least
/// two tokens); "" when there is none.
inline std::string spanning_stop(const text::tokenizer& tok, const std::vector<int64_t>& tokens,
                                 size_t from, size_t length = 3) {
  for (size_t k = std::max<size_t>(from, 2); k <= tokens.size(); ++k) {
    auto before = prefix_text(tok, tokens, k - 1);
    auto text = prefix_text(tok, tokens, k);
    if (ends_in_replacement(before) || ends_in_replacement(text) || text.size() < length ||
        text.size() <= before.size() || text.compare(0, before.size(), before) != 0 ||
        text.size() - before.size() >= length)
      continue;
    auto s = text.substr(text.size() - length);
    bool printable = true;
    for (char c : s)
      printable = printable && c >= 0x20 && c < 0x7f;
    if (printable)
      return s;
  }
  return "";
}

} // namespace rlforge::backends::testing
