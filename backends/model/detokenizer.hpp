#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rlforge::backends {

/// The text of one generated row as its tokens come (stop strings, backends/model/stop_strings.hpp):
/// each token releases the text that became final with it, special tokens written as text, and
/// nothing after the last complete UTF-8 character until the character completes. One stream
/// per row; not thread-safe (one thread at a time). A stream keeps its tokenizer alive.
class token_text_stream {
public:
  virtual ~token_text_stream() = default;
  /// Appends the row's next token; returns the text that became final with it (often empty).
  /// An id that names no token of the tokenizer (a model vocabulary padded past it) adds no
  /// text and leaves the stream unchanged.
  virtual std::string push(int64_t id) = 0;
};

/// A model's tokenizer as the engines see it: a source of token text streams. The backends
/// know tokenizers only through this interface, so they build without rlforge::text (the GPU
/// subset, RLFORGE_MINIMAL_DEPS); backends/model/text_detokenizer.hpp makes one from a
/// `text::tokenizer`. Immutable after construction; `stream` may be called from any thread.
class detokenizer {
public:
  virtual ~detokenizer() = default;
  virtual std::unique_ptr<token_text_stream> stream() const = 0;
};

/// Whether the model directory `dir` holds a tokenizer (tokenizer.json or tokenizer.model).
bool has_tokenizer(const std::string& dir);

/// The tokenizer of the model directory `dir`, for stop strings. Throws `backends::error`:
/// `not_found` when `dir` holds none, `invalid_argument` naming the file when it does not load,
/// `unsupported` in a build without rlforge::text (RLFORGE_MINIMAL_DEPS), which reads no
/// tokenizer at all.
std::shared_ptr<const detokenizer> load_detokenizer(const std::string& dir);

} // namespace rlforge::backends
