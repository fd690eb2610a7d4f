#pragma once

#include <memory>
#include <string>

#include "text/tokenizer_backend.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

/// A SentencePiece model file (tokenizer.model, Llama 2 style), run by Debian's libsentencepiece.
namespace rlforge::text {

/// Encoding is SentencePiece's own (its normalization, its handling of user-defined symbols;
/// control symbols such as "<s>" written in the text are not recognized as tokens). With
/// `add_special_tokens`, the BOS id is prepended and the EOS id appended as configured. Decoding
/// runs SentencePiece on each stretch of ordinary ids; control and unknown tokens are special: left
/// out with `skip_special_tokens`, else written as their piece text between the stretches.
/// Immutable once loaded; safe to use from many threads at once (SentencePiece's encode and decode
/// are const).
class sentencepiece_tokenizer final : public tokenizer_backend {
public:
  /// Loads `model_file`; throws `tokenizer_error` naming it when SentencePiece refuses it, or when
  /// a BOS/EOS is requested that the model does not define. Unset, `add_bos` is true when the
  /// model has a BOS piece (Llama's default) and `add_eos` is false.
  static std::unique_ptr<const sentencepiece_tokenizer>
  load(const std::string& model_file, std::optional<bool> add_bos, std::optional<bool> add_eos);
  ~sentencepiece_tokenizer() override;

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const int64_t* ids, size_t n, bool skip_special_tokens) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;
  bool is_special(int64_t id) const override;
  named_tokens own_special_tokens() const override;
  std::string describe() const override { return "sentencepiece " + file_; }

private:
  sentencepiece_tokenizer();

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string file_;
  bool add_bos_ = false;
  bool add_eos_ = false;
};

} // namespace rlforge::text
