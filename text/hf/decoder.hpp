#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/hf/json_reader.hpp"

/// tokenizer.json's `decoder`: ByteLevel, ByteFallback, Metaspace, Replace, Fuse, Strip,
/// BPEDecoder and Sequence, with the semantics of HF tokenizers. Other types are refused.
namespace rlforge::text::hf {

/// One decoder: rewrites the list of token strings (HF's `decode_chain`); the tokenizer joins the
/// final list. Immutable once built; safe to call from many threads at once.
class decoder {
public:
  virtual ~decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

/// Builds the decoder of object `j` (at JSON path `where`). Throws `tokenizer_error` naming the
/// type and `where` for an unsupported type.
std::unique_ptr<const decoder> make_decoder(const json& j, const std::string& where);

} // namespace rlforge::text::hf
