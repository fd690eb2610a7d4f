#pragma once

#include <optional>
#include <string>
#include <string_view>

/// What rlforge::text reads from a model's tokenizer_config.json. That file belongs to the
/// Python `transformers` layer and carries many settings of its own (chat templates, padding side,
/// `clean_up_tokenization_spaces`, ...); only the fields below are read, every other one is not
/// used by this library.
namespace rlforge::text {

struct tokenizer_config {
  /// The names of the special tokens: `bos_token`, `eos_token`, `pad_token`, `unk_token`, each a
  /// string, null, or an object with a string `content` (transformers' AddedToken).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  /// `add_bos_token` / `add_eos_token`: read for SentencePiece models only (a tokenizer.json
  /// carries its own post-processor).
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
};

/// Parses tokenizer_config.json text; `source` (the file) prefixes errors. Throws
/// `tokenizer_error` for malformed JSON or a field of the wrong type.
tokenizer_config parse_tokenizer_config(std::string_view text, const std::string& source);

} // namespace rlforge::text
