#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

/// The interface behind `text::tokenizer`: one implementation per file format
/// (`hf::hf_tokenizer` for tokenizer.json, `sentencepiece_tokenizer` for tokenizer.model).
namespace rlforge::text {

/// A loaded tokenizer model. Implementations are immutable once built and every method is safe
/// to call from many threads at once. Errors are `tokenizer_error`.
class tokenizer_backend {
public:
  virtual ~tokenizer_backend() = default;

  /// The ids of `text`; throws on invalid UTF-8.
  virtual std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const = 0;

  /// The text of `ids[0..n)`; throws for an id that names no token.
  virtual std::string decode(const int64_t* ids, size_t n, bool skip_special_tokens) const = 0;

  /// One more than the largest id.
  virtual int64_t vocab_size() const = 0;

  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;

  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;

  /// Whether `id` is a special token (skipped by `decode(..., true)`).
  virtual bool is_special(int64_t id) const = 0;

  /// The special tokens the model file itself names (SentencePiece's bos/eos/unk/pad ids); empty
  /// for tokenizer.json, whose names come from tokenizer_config.json.
  struct named_tokens {
    std::optional<std::string> bos, eos, pad, unk;
  };
  virtual named_tokens own_special_tokens() const { return {}; }

  /// "tokenizer.json" or "sentencepiece", and the file it was read from.
  virtual std::string describe() const = 0;
};

} // namespace rlforge::text
