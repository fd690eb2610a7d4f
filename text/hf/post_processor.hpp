#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/hf/json_reader.hpp"

/// tokenizer.json's `post_processor`: TemplateProcessing, ByteLevel and Sequence, with the
/// semantics of HF tokenizers for a single sequence. ByteLevel only trims offsets, which this
/// library does not produce, so it leaves ids alone. Other types are refused.
namespace rlforge::text::hf {

/// One post-processor. Immutable once built; safe to call from many threads at once.
class post_processor {
public:
  virtual ~post_processor() = default;

  /// Turns the ids of one encoded sequence into the final ids; special tokens of a template are
  /// added only when `add_special_tokens`.
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

/// Builds the post-processor of object `j` (at JSON path `where`). Throws `tokenizer_error` for
/// an unsupported type, or a template naming a special token it does not define.
std::unique_ptr<const post_processor> make_post_processor(const json& j, const std::string& where);

} // namespace rlforge::text::hf
