#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

/// Incremental detokenization while tokens are generated, for checking stop strings as they come.
namespace rlforge::text {

/// Turns a growing list of ids into the text each new id completes, without ever ending a piece
/// inside a multi-byte character: while the decoded window ends in U+FFFD (an incomplete UTF-8
/// sequence, or a byte-fallback run not yet valid), `push` holds the text back. The concatenation
/// of everything `push` and `finish` return equals `decode(all ids)` (same `skip_special_tokens`)
/// for the decoders of the supported families; the one known exception is HF's ByteFallback rule
/// that turns a whole run of byte tokens holding an invalid byte into U+FFFDs, which a stream that
/// already released the valid start of the run cannot take back. Only the last few ids are decoded
/// again on each push (a window that starts at the last released boundary), so the cost per id does
/// not grow with the length of the generation.
///
/// Holds a copy of the tokenizer handle (the model stays loaded while it lives). One generation
/// per stream_decoder, used by one thread at a time.
class stream_decoder {
public:
  stream_decoder(tokenizer tok, bool skip_special_tokens);

  /// Appends `id`; returns the text that became final with it (often empty). Throws
  /// `tokenizer_error` for an id that names no token (the stream is then unchanged).
  std::string push(int64_t id);

  /// Returns whatever is still held back (a text that really ends in U+FFFD, or an incomplete
  /// character at the end of generation, as U+FFFD) and starts a new, empty stream.
  std::string finish();

private:
  tokenizer tok_;
  bool skip_special_tokens_;
  std::vector<int64_t> ids_;
  // ids_[prefix_..read_) decode to `prefix_text_`, text already released; ids_[read_..) are held.
  size_t prefix_ = 0;
  size_t read_ = 0;
  std::string prefix_text_;
};

} // namespace rlforge::text
