#pragma once

#include <stdexcept>
#include <string>

/// The one exception type of the chat-template engine (std only).
namespace rlforge::chat {

/// What went wrong, and so whose fault it is.
enum class error_kind {
  syntax,      ///< the template does not parse
  unsupported, ///< the template uses something outside the supported subset (named)
  runtime,     ///< evaluating the template failed (a type error, an undefined value used, ...)
  raised,      ///< the template itself called raise_exception(message)
  config,      ///< the tokenizer configuration is missing, unreadable or has no usable template
};

/// "syntax", "unsupported", "runtime", "raised" or "config".
const char* to_string(error_kind x) noexcept;

/// A position in the template source: 1-based line and column (in code points); line 0 = none.
struct source_position {
  int line = 0;
  int column = 0;
};

/// Thrown by every function of chat/. `what()` reads "chat template <kind> error at line L,
/// column C: <detail>" (without the position part when there is none); `detail()` is the bare
/// message, which names the offending filter, test, tag, function, value or file.
class template_error : public std::runtime_error {
public:
  template_error(error_kind kind, const std::string& detail, source_position where = {});

  error_kind kind() const noexcept { return kind_; }
  source_position where() const noexcept { return where_; }
  const std::string& detail() const noexcept { return detail_; }

private:
  error_kind kind_;
  source_position where_;
  std::string detail_;
};

} // namespace rlforge::chat
