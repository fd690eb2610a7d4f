#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_backend.hpp"

/// rlforge::text: Hugging Face tokenizers for the model families rlforge runs (GPT-2, Llama 2/3,
/// Qwen 2/2.5/3), in standard C++ plus Debian libraries (PCRE2, ICU, SentencePiece, nlohmann
/// JSON). No CAF, no torch, no other rlforge folder.
///
/// ```cpp
/// auto tok = text::tokenizer::load("/models/qwen3");   // tokenizer.json or tokenizer.model
/// std::vector<int64_t> ids = tok.encode("Hello world", /*add_special_tokens=*/true);
/// std::string back = tok.decode(ids, /*skip_special_tokens=*/true);
/// ```
namespace rlforge::text {

/// A special token named by tokenizer_config.json (or by a SentencePiece model), with its id.
struct special_token {
  std::string content;
  int64_t id;
};

/// A loaded tokenizer. Immutable: every const method is safe to call from many threads at once.
/// Copies are cheap and share the loaded model (it lives as long as any copy). Every error is a
/// `tokenizer_error` whose message names what was wrong.
class tokenizer {
public:
  /// Loads the tokenizer of model directory `dir`: its tokenizer.json (HF tokenizers semantics),
  /// or, when there is none, its tokenizer.model (SentencePiece). tokenizer_config.json, when
  /// present, names the special tokens (see `tokenizer_config`). Throws `tokenizer_error` naming
  /// the file and what is wrong: missing files, malformed JSON, an unsupported component type, a
  /// special token missing from the vocabulary.
  static tokenizer load(const std::filesystem::path& dir);

  /// Whether directory `dir` holds a file `load` reads (tokenizer.json or tokenizer.model). It
  /// says nothing of whether loading would succeed.
  static bool exists_in(const std::filesystem::path& dir);

  /// A tokenizer from tokenizer.json text and optional tokenizer_config.json text (empty: none).
  /// `source` names the document in errors.
  static tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {},
                             const std::string& source = "tokenizer.json");

  /// The ids of `text` (UTF-8; invalid UTF-8 is refused naming the byte offset). Added and
  /// special tokens written in the text are recognized. With `add_special_tokens`, the
  /// post-processor adds the template's tokens (e.g. Llama's BOS).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;

  /// The text of `ids`, through the decoder. Byte sequences that are not valid UTF-8 come out as
  /// U+FFFD, as in HF. Special tokens are left out with `skip_special_tokens`. An id that names no
  /// token is refused.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;
  std::string decode(const int64_t* ids, size_t n, bool skip_special_tokens = false) const;

  /// One more than the largest token id (added tokens included): the embedding rows a model
  /// needs. Ids in [0, vocab_size()) may still name no token when the file leaves gaps.
  int64_t vocab_size() const;

  /// The id of the token spelled `token` (added tokens first, then the model's vocabulary).
  std::optional<int64_t> token_to_id(std::string_view token) const;

  /// The spelling of token `id` (as written in the vocabulary: GPT-2 byte characters for
  /// byte-level models, "▁" for SentencePiece spaces).
  std::optional<std::string> id_to_token(int64_t id) const;

  /// Whether `id` is a special token.
  bool is_special(int64_t id) const;

  /// BOS, EOS, padding and unknown tokens: from tokenizer_config.json when it names them, else
  /// those the SentencePiece model defines; nullopt when neither does.
  const std::optional<special_token>& bos_token() const noexcept { return bos_; }
  const std::optional<special_token>& eos_token() const noexcept { return eos_; }
  const std::optional<special_token>& pad_token() const noexcept { return pad_; }
  const std::optional<special_token>& unk_token() const noexcept { return unk_; }

  /// Which kind of file was loaded, and from where.
  std::string describe() const;

private:
  tokenizer() = default;
  std::shared_ptr<const tokenizer_backend> backend_;
  std::optional<special_token> bos_, eos_, pad_, unk_;
  friend class tokenizer_builder;
};

} // namespace rlforge::text
