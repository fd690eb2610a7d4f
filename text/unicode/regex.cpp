#include "text/unicode/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/error.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::unicode {

namespace {

constexpr std::string_view word_items = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0)
    return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

// Scratch space of one thread: PCRE2 match data and a JIT stack larger than the 32 KiB default,
// so that very long words and whitespace runs do not hit the JIT's stack limit.
struct thread_scratch {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;

  thread_scratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    if (context != nullptr && stack != nullptr)
      pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~thread_scratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  thread_scratch(const thread_scratch&) = delete;
  thread_scratch& operator=(const thread_scratch&) = delete;
};

thread_scratch& scratch() {
  thread_local thread_scratch s;
  if (s.data == nullptr || s.context == nullptr)
    fail("regex: out of memory for PCRE2 match data");
  return s;
}

} // namespace

std::string translate_oniguruma(std::string_view pattern, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  size_t i = 0;
  auto refuse = [&](const std::string& what) {
    fail(where + ": regex \"" + std::string(pattern) + "\": " + what +
         " is not supported (Oniguruma and PCRE2 disagree on it)");
  };
  while (i < pattern.size()) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[i + 1];
      if (e == 'Q') {
        // \Q...\E quotes literally: copy it untouched.
        size_t end = pattern.find("\\E", i + 2);
        size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop;
        continue;
      }
      switch (e) {
      case 's':
        out.append("\\p{White_Space}");
        break;
      case 'S':
        out.append("\\P{White_Space}");
        break;
      case 'h':
        out.append("\\p{ASCII_Hex_Digit}");
        break;
      case 'H':
        out.append("\\P{ASCII_Hex_Digit}");
        break;
      case 'w':
        if (in_class)
          out.append(word_items);
        else
          out.append("[").append(word_items).append("]");
        break;
      case 'W':
        if (in_class)
          refuse("\\W inside a character class");
        out.append("[^").append(word_items).append("]");
        break;
      case 'b':
        if (!in_class)
          refuse("the word boundary \\b");
        out.append("\\b"); // a backspace inside a class, the same in both engines
        break;
      case 'B':
        refuse("\\B");
        break;
      default:
        out.push_back(c);
        out.push_back(e);
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      // A ']' right after '[' or '[^' is a literal member of the class.
      if (i < pattern.size() && pattern[i] == '^') {
        out.push_back('^');
        ++i;
      }
      if (i < pattern.size() && pattern[i] == ']') {
        out.push_back(']');
        ++i;
      }
      continue;
    }
    if (in_class && c == '[') {
      // A POSIX class such as [:alpha:] means the same in both engines; a nested class does not
      // (Oniguruma nests, PCRE2 reads a literal '[').
      if (i + 1 >= pattern.size() || pattern[i + 1] != ':')
        refuse("a nested character class");
      size_t end = pattern.find(":]", i + 2);
      size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
      out.append(pattern.substr(i, stop - i));
      i = stop;
      continue;
    }
    if (in_class && c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&')
      refuse("the class intersection &&");
    if (in_class && c == ']')
      in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

void regex::build(const std::string& translated, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr)
    fail(where + ": regex \"" + source_ + "\" does not compile: " + pcre2_message(error) +
         " (at offset " + std::to_string(offset) + " of \"" + translated + "\")");
  code_ = std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

regex regex::compile(std::string_view pattern, const std::string& where) {
  require_valid_utf8(pattern, where + ": regex");
  regex r;
  r.source_ = std::string(pattern);
  r.build(translate_oniguruma(pattern, where), where);
  return r;
}

regex regex::literal(std::string_view text, const std::string& where) {
  require_valid_utf8(text, where + ": pattern");
  std::string escaped;
  escaped.reserve(text.size() * 2);
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    bool alnum = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
    if (u < 0x80 && !alnum)
      escaped.push_back('\\');
    escaped.push_back(c);
  }
  regex r;
  r.source_ = std::string(text);
  r.build(escaped, where);
  return r;
}

void regex::find_all(std::string_view text, std::vector<match_span>& out) const {
  auto& s = scratch();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t n = text.size();
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= n) {
    int rc =
        jit_ ? pcre2_jit_match(code_.get(), subject, n, start, 0, s.data, s.context)
             : pcre2_match(code_.get(), subject, n, start, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0)
      fail("regex \"" + source_ + "\": matching failed at byte " + std::to_string(start) + ": " +
           pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    size_t b = ov[0];
    size_t e = ov[1];
    if (b == e && have_last && e == last_end) {
      if (start >= n)
        break;
      start += sequence_length(static_cast<unsigned char>(text[start]));
      continue;
    }
    out.push_back({b, e});
    start = e;
    have_last = true;
    last_end = e;
  }
}

} // namespace rlforge::text::unicode
