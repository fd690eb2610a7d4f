#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

/// Regular expressions with the meaning Hugging Face tokenizers gives them (Oniguruma syntax),
/// run by PCRE2 (UTF + UCP, JIT-compiled) with Unicode classes from PCRE2's own Unicode data.
namespace rlforge::text::unicode {

/// One match: byte offsets [begin, end) into the searched text.
struct match_span {
  size_t begin;
  size_t end;
};

/// A compiled pattern. Immutable once built; `find_all` may run on one `regex` from many threads at
/// once (each thread matches with its own scratch space). Copies share the compiled code.
class regex {
public:
  /// Compiles a pattern written for Oniguruma, the engine of HF tokenizers. The escapes whose
  /// meaning differs between the engines are translated so that PCRE2 matches what Oniguruma
  /// matches: `\s`/`\S` (White_Space), `\h`/`\H` (ASCII hex digit), `\w`/`\W` (Alphabetic, marks,
  /// Nd, Pc, Join_Control). `\b`, `\B`, a `\W` inside a character class, nested classes and
  /// class intersections (`&&`) are refused. Throws
  /// `tokenizer_error` naming `where`, the pattern and PCRE2's message when it does not compile.
  static regex compile(std::string_view pattern, const std::string& where);

  /// A pattern that matches `text` literally (what HF builds for a `{"String": ...}` pattern).
  static regex literal(std::string_view text, const std::string& where);

  /// Appends to `out` the matches in `text` (valid UTF-8) from left to right, as Oniguruma's
  /// iterator yields them: non-overlapping, each search starting where the previous match ended,
  /// and an empty match right at the end of the previous match skipped (the search moves on by one
  /// character). Throws `tokenizer_error` if PCRE2 gives up (e.g. its JIT stack limit).
  void find_all(std::string_view text, std::vector<match_span>& out) const;

  /// The pattern as written in the tokenizer file.
  const std::string& source() const noexcept { return source_; }

private:
  regex() = default;
  void build(const std::string& translated, const std::string& where);

  std::string source_;
  std::shared_ptr<pcre2_real_code_8> code_;
  bool jit_ = false;
};

/// `pattern` with Oniguruma's `\s \S \h \H \w \W` rewritten for PCRE2 (see `regex::compile`).
/// Exposed for tests. Throws `tokenizer_error` naming `where` for the constructs it refuses.
std::string translate_oniguruma(std::string_view pattern, const std::string& where);

} // namespace rlforge::text::unicode
