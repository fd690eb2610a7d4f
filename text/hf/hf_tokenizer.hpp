#pragma once

#include <memory>
#include <string>
#include <unordered_set>

#include "text/hf/added_vocabulary.hpp"
#include "text/hf/bpe_model.hpp"
#include "text/hf/decoder.hpp"
#include "text/hf/json_reader.hpp"
#include "text/hf/normalizer.hpp"
#include "text/hf/post_processor.hpp"
#include "text/hf/pre_tokenizer.hpp"
#include "text/tokenizer_backend.hpp"

/// A tokenizer.json, run as HF tokenizers (0.23) runs it: added tokens are cut out of the text,
/// the rest is normalized, split again on `normalized` added tokens, pre-tokenized and encoded by
/// the model, then post-processed; decoding maps ids to tokens and runs the decoder.
namespace rlforge::text::hf {

class hf_tokenizer final : public tokenizer_backend {
public:
  /// Builds the pipeline of tokenizer.json document `j`; `source` (the file) prefixes every error.
  /// Refuses an unknown `version`, a non-null `truncation` or `padding` (this library returns one
  /// unpadded, untruncated sequence), unknown fields and every unsupported component type.
  static std::unique_ptr<const hf_tokenizer> from_json(const json& j, const std::string& source);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const int64_t* ids, size_t n, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;
  bool is_special(int64_t id) const override;
  std::string describe() const override { return "tokenizer.json " + source_; }

private:
  hf_tokenizer() = default;
  void encode_section(std::string_view text, bool at_start, std::vector<int32_t>& ids) const;

  std::string source_;
  std::unique_ptr<const normalizer> normalizer_;
  std::unique_ptr<const pre_tokenizer> pre_tokenizer_;
  std::unique_ptr<const bpe_model> model_;
  std::unique_ptr<const post_processor> post_processor_;
  std::unique_ptr<const decoder> decoder_;
  std::unique_ptr<const added_vocabulary> added_;
  std::unordered_set<std::string> special_contents_;
  bool raw_bytes_ = false;
  int64_t vocab_size_ = 0;
};

} // namespace rlforge::text::hf
