#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/hf/json_reader.hpp"

/// tokenizer.json's `added_tokens`: tokens cut out of the text before normalization and
/// pre-tokenization, with HF tokenizers' rules. Tokens with `normalized: false` are found in the
/// raw text; those with `normalized: true` are found, in their normalized spelling, in each
/// normalized section. Matching is leftmost-longest; `single_word` discards a match touching a
/// word character (Rust regex `\w`) on either side; `lstrip`/`rstrip` make the token swallow the
/// whitespace (White_Space) on its left/right.
namespace rlforge::text::hf {

class normalizer;

/// One entry of `added_tokens`.
struct added_token {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

/// Reads the `added_tokens` array at `where`. Throws `tokenizer_error` for a malformed entry, a
/// content given two ids or an id given two contents.
std::vector<added_token> parse_added_tokens(const json& j, const std::string& where);

/// A stretch of text: an added token (`id >= 0`) or text for the model (`id == -1`).
struct section {
  std::string_view text;
  int32_t id;
  /// Byte offset of `text` in the string that was split.
  size_t offset;
};

/// The added tokens of a tokenizer. Immutable once built; safe to use from many threads at once.
class added_vocabulary {
public:
  /// `n` (may be null) normalizes the content of the `normalized` tokens for matching; it is not
  /// kept.
  added_vocabulary(std::vector<added_token> tokens, const normalizer* n);
  ~added_vocabulary();
  added_vocabulary(const added_vocabulary&) = delete;
  added_vocabulary& operator=(const added_vocabulary&) = delete;

  /// Splits raw `text` on the tokens with `normalized: false`; appends sections covering it.
  void split_raw(std::string_view text, std::vector<section>& out) const;

  /// Splits normalized `text` on the tokens with `normalized: true`; appends sections covering it.
  void split_normalized(std::string_view text, std::vector<section>& out) const;

  /// The token with `id`, or nullptr.
  const added_token* find(int32_t id) const noexcept;

  /// The id of the added token whose content is `content`.
  std::optional<int32_t> id_of(std::string_view content) const;

  /// What `decode` passes to the decoder for added token `id`: its normalized spelling when it is
  /// a `normalized` token that the normalizer changes (HF tokenizers 0.23), else its content.
  const std::string& decode_form(int32_t id) const;

  const std::vector<added_token>& tokens() const noexcept { return tokens_; }

private:
  class trie;
  void split(std::string_view text, const trie* t, std::vector<section>& out) const;

  std::vector<added_token> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, std::string> normalized_forms_;
  std::unique_ptr<trie> raw_trie_;
  std::unique_ptr<trie> normalized_trie_;
};

} // namespace rlforge::text::hf
