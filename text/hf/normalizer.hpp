#pragma once

#include <memory>
#include <string>

#include "text/hf/json_reader.hpp"

/// tokenizer.json's `normalizer`: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend,
/// Replace and Sequence, with the semantics of HF tokenizers. Other types are refused.
namespace rlforge::text::hf {

/// One normalizer. Immutable once built; `normalize` is safe to call from many threads at once.
class normalizer {
public:
  virtual ~normalizer() = default;

  /// Normalizes `s` (valid UTF-8) in place. Sets `start_kept` to false when characters at the
  /// start of `s` were removed, so that the result no longer begins at the start of the original
  /// text (what Metaspace's `prepend_scheme: "first"` checks); leaves it alone otherwise.
  virtual void normalize(std::string& s, bool& start_kept) const = 0;
};

/// Builds the normalizer described by object `j` (at JSON path `where`). Throws `tokenizer_error`
/// naming the type and `where` for an unsupported type, and naming the field for a malformed one.
std::unique_ptr<const normalizer> make_normalizer(const json& j, const std::string& where);

} // namespace rlforge::text::hf
