#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/hf/json_reader.hpp"

/// tokenizer.json's `pre_tokenizer`: Split, ByteLevel, Metaspace and Sequence, with the semantics
/// of HF tokenizers. Other types are refused. Offsets are not tracked (this library returns ids,
/// not offsets), so ByteLevel's `trim_offsets` has nothing to act on.
namespace rlforge::text::hf {

/// A piece of text on its way to the model.
struct piece {
  std::string_view text;
  /// Whether the piece begins at the start of the original input (Metaspace's "first" scheme).
  bool at_start;
};

/// The pieces of one section of the input. Owns the bytes that pre-tokenizers rewrite; the text it
/// starts from is viewed, not copied, and must outlive it. Used by one thread at a time.
class pre_tokenized {
public:
  pre_tokenized(std::string_view text, bool at_start);

  std::vector<piece>& pieces() noexcept { return pieces_; }

  /// A new empty string owned by this object; pieces may view it once it is filled.
  std::string& new_buffer();

private:
  std::vector<piece> pieces_;
  std::deque<std::string> buffers_;
};

/// One pre-tokenizer. Immutable once built; safe to call from many threads at once.
class pre_tokenizer {
public:
  virtual ~pre_tokenizer() = default;

  /// Splits (and, for ByteLevel and Metaspace, rewrites) every piece of `p`.
  virtual void pre_tokenize(pre_tokenized& p) const = 0;

  /// Whether the last thing this pre-tokenizer does is ByteLevel's mapping of bytes to GPT-2's
  /// alphabet, so that a model that reads raw bytes can skip it.
  virtual bool ends_with_byte_level() const noexcept { return false; }

  /// `pre_tokenize` without that final mapping: the pieces stay UTF-8 text. Only valid when
  /// `ends_with_byte_level()`.
  virtual void pre_tokenize_unmapped(pre_tokenized& p) const;
};

/// Builds the pre-tokenizer described by object `j` (at JSON path `where`). Throws
/// `tokenizer_error` naming the type and `where` for an unsupported type.
std::unique_ptr<const pre_tokenizer> make_pre_tokenizer(const json& j, const std::string& where);

/// How Split (and Metaspace) treat the delimiters they find, as HF's SplitDelimiterBehavior.
enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

/// One stretch of a piece found by a pattern: [begin, end) and whether it matched.
struct split_span {
  size_t begin;
  size_t end;
  bool is_match;
};

/// The spans kept by `behavior` from `spans` (which cover a piece in order), as [begin, end)
/// ranges, with HF's merging rules. Exposed for tests.
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<split_span>& spans,
                                                      split_behavior behavior);

} // namespace rlforge::text::hf
