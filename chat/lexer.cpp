#include "chat/lexer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

std::string normalize_newlines(std::string_view source) {
  const std::u32string cps = decode_utf8(source);
  std::u32string out;
  out.reserve(cps.size());
  for (std::size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (c == U'\r' && i + 1 < cps.size() && cps[i + 1] == U'\n') {
      out.push_back(U'\n');
      ++i;
    } else if (is_line_break(c)) {
      out.push_back(U'\n');
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == U'\n')
    out.pop_back();
  return encode_utf8(out);
}

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/// Length in bytes of the Python-whitespace code point starting at `s[i]`, or 0.
std::size_t space_at(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80)
    return is_space(c) ? 1 : 0;
  std::size_t len = (c & 0xE0) == 0xC0 ? 2 : ((c & 0xF0) == 0xE0 ? 3 : 4);
  if (i + len > s.size())
    return 0;
  const std::u32string cp = decode_utf8(s.substr(i, len));
  return !cp.empty() && is_space(cp[0]) ? len : 0;
}

std::string rstrip_spaces(std::string_view s) {
  std::u32string cps = decode_utf8(s);
  while (!cps.empty() && is_space(cps.back()))
    cps.pop_back();
  return encode_utf8(cps);
}

class lexer {
public:
  explicit lexer(std::string_view src) : src_(src) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n')
        line_starts_.push_back(i + 1);
  }

  std::vector<token> run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const std::size_t tag = find_tag(pos);
      if (tag == std::string_view::npos) {
        emit_text(std::string(src_.substr(pos)), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      std::string text(src_.substr(pos, tag - pos));
      if (mod == '-') {
        text = rstrip_spaces(text);
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the start of the line and a block or
        // comment tag.
        const std::size_t nl = text.rfind('\n');
        const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          const bool blank = std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos),
                                         text.end(), [](char c) { return c == ' ' || c == '\t'; });
          if (blank)
            text.resize(l_pos);
        }
      }
      emit_text(std::move(text), pos);
      std::size_t p = tag + 2;
      if (mod == '-' || mod == '+')
        ++p;
      if (kind == '#') {
        pos = end_comment(tag, p);
      } else {
        pos = lex_tag(kind, tag, p);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    token end;
    end.kind = token_kind::end;
    end.where = where(src_.size());
    out_.push_back(std::move(end));
    return std::move(out_);
  }

private:
  source_position where(std::size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const std::size_t line = static_cast<std::size_t>(it - line_starts_.begin());
    const std::size_t start = line_starts_[line - 1];
    const auto column = code_point_count(src_.substr(start, offset - start));
    return {static_cast<int>(line), static_cast<int>(column) + 1};
  }

  [[noreturn]] void fail(const std::string& message, std::size_t offset) const {
    throw template_error(error_kind::syntax, message, where(offset));
  }

  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string_view::npos;
  }

  void emit_text(std::string text, std::size_t offset) {
    if (text.empty())
      return;
    token t;
    t.kind = token_kind::text;
    t.text = std::move(text);
    t.where = where(offset);
    out_.push_back(std::move(t));
  }

  void emit(token_kind kind, std::string text, std::size_t offset) {
    token t;
    t.kind = kind;
    t.text = std::move(text);
    t.where = where(offset);
    out_.push_back(std::move(t));
  }

  std::size_t skip_spaces(std::size_t p) const {
    while (p < src_.size()) {
      const std::size_t len = space_at(src_, p);
      if (len == 0)
        break;
      p += len;
    }
    return p;
  }

  std::size_t end_comment(std::size_t tag, std::size_t p) {
    const std::size_t close = src_.find("#}", p);
    if (close == std::string_view::npos)
      fail("unterminated comment: '{#' without '#}'", tag);
    std::size_t pos = close + 2;
    const char before = close > p ? src_[close - 1] : '\0';
    if (before == '-')
      return skip_spaces(pos);
    if (before != '+' && pos < src_.size() && src_[pos] == '\n')
      ++pos; // trim_blocks
    return pos;
  }

  bool starts(std::size_t p, std::string_view s) const { return src_.substr(p, s.size()) == s; }

  std::size_t lex_tag(char kind, std::size_t tag, std::size_t p) {
    const bool block = kind == '%';
    if (block) {
      std::size_t q = skip_spaces(p);
      std::size_t e = q;
      while (e < src_.size() && is_name_char(src_[e]))
        ++e;
      if (src_.substr(q, e - q) == "raw")
        throw template_error(error_kind::unsupported, "tag 'raw' is not supported", where(q));
    }
    emit(block ? token_kind::block_begin : token_kind::variable_begin, block ? "{%" : "{{", tag);
    std::vector<char> brackets;
    while (true) {
      p = skip_spaces(p);
      if (p >= src_.size())
        fail(std::string("unexpected end of template: '") + (block ? "{%" : "{{") +
                 "' is never closed by '" + (block ? "%}" : "}}") + "'",
             tag);
      if (brackets.empty()) {
        if (!block) {
          if (starts(p, "-}}")) {
            emit(token_kind::variable_end, "}}", p);
            return skip_spaces(p + 3);
          }
          if (starts(p, "}}")) {
            emit(token_kind::variable_end, "}}", p);
            return p + 2;
          }
        } else {
          if (starts(p, "-%}")) {
            emit(token_kind::block_end, "%}", p);
            return skip_spaces(p + 3);
          }
          if (starts(p, "+%}")) {
            emit(token_kind::block_end, "%}", p);
            return p + 3;
          }
          if (starts(p, "%}")) {
            emit(token_kind::block_end, "%}", p);
            p += 2;
            if (p < src_.size() && src_[p] == '\n')
              ++p; // trim_blocks
            return p;
          }
        }
      }
      p = lex_token(p, brackets);
    }
  }

  std::size_t lex_token(std::size_t p, std::vector<char>& brackets) {
    const char c = src_[p];
    if (c == '\'' || c == '"')
      return lex_string(p);
    if (is_digit(c))
      return lex_number(p);
    if (is_name_start(c)) {
      std::size_t e = p;
      while (e < src_.size() && is_name_char(src_[e]))
        ++e;
      emit(token_kind::name, std::string(src_.substr(p, e - p)), p);
      return e;
    }
    static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two) {
      if (starts(p, op)) {
        emit(token_kind::op, op, p);
        return p + 2;
      }
    }
    static const std::string_view one = "+-*/%~<>=()[]{},.:|";
    if (one.find(c) == std::string_view::npos) {
      std::string shown;
      if (static_cast<unsigned char>(c) < 0x80) {
        shown = std::string(1, c);
      } else {
        std::size_t e = p + 1;
        while (e < src_.size() && (static_cast<unsigned char>(src_[e]) & 0xC0) == 0x80)
          ++e;
        shown = std::string(src_.substr(p, e - p));
      }
      fail("unexpected character '" + shown + "'", p);
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : (c == ']' ? '[' : '{');
      if (brackets.empty() || brackets.back() != open)
        fail(std::string("unexpected '") + c + "'", p);
      brackets.pop_back();
    }
    emit(token_kind::op, std::string(1, c), p);
    return p + 1;
  }

  std::size_t lex_string(std::size_t p) {
    const char quote = src_[p];
    std::string out;
    std::size_t i = p + 1;
    while (true) {
      if (i >= src_.size())
        fail("unterminated string literal", p);
      const char c = src_[i];
      if (c == quote)
        break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size())
        fail("unterminated string literal", p);
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
      case '\n':
        break; // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const std::size_t digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        char32_t cp = 0;
        for (std::size_t k = 0; k < digits; ++k) {
          const int h = i + k < src_.size() ? hex_value(src_[i + k]) : -1;
          if (h < 0)
            fail(std::string("truncated \\") + e + " escape in a string literal", i - 2);
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        i += digits;
        if (cp > 0x10FFFF)
          fail("escape \\U beyond U+10FFFF in a string literal", i - 2 - digits);
        if (cp >= 0xD800 && cp <= 0xDFFF)
          throw template_error(error_kind::unsupported,
                               "a lone surrogate escape in a string literal is not supported",
                               where(i - 2 - digits));
        append_utf8(out, cp);
        break;
      }
      case 'N':
        throw template_error(error_kind::unsupported,
                             "named escapes (\\N{...}) in string literals are not supported",
                             where(i - 2));
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
            cp = cp * 8 + static_cast<char32_t>(src_[i] - '0');
          append_utf8(out, cp);
        } else {
          // Python keeps unknown escapes as they are.
          out.push_back('\\');
          --i;
        }
      }
    }
    emit(token_kind::string, std::move(out), p);
    return i + 1;
  }

  std::size_t lex_digits(std::size_t i, bool (*ok)(char)) const {
    while (i < src_.size() &&
           (ok(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() && ok(src_[i + 1]))))
      ++i;
    return i;
  }

  std::size_t lex_number(std::size_t p) {
    const bool after_dot =
        !out_.empty() && out_.back().kind == token_kind::op && out_.back().text == ".";
    auto strip = [](std::string_view s) {
      std::string r;
      for (char c : s)
        if (c != '_')
          r.push_back(c);
      return r;
    };
    if (src_[p] == '0' && p + 1 < src_.size() &&
        (src_[p + 1] == 'x' || src_[p + 1] == 'o' || src_[p + 1] == 'b' || src_[p + 1] == 'X' ||
         src_[p + 1] == 'O' || src_[p + 1] == 'B')) {
      const char base_char = static_cast<char>(src_[p + 1] | 0x20);
      const int base = base_char == 'x' ? 16 : (base_char == 'o' ? 8 : 2);
      std::size_t e = p + 2;
      while (e < src_.size() &&
             (src_[e] == '_' || (hex_value(src_[e]) >= 0 && hex_value(src_[e]) < base)))
        ++e;
      const std::string digits = strip(src_.substr(p + 2, e - p - 2));
      if (digits.empty())
        fail("invalid integer literal", p);
      token t;
      t.kind = token_kind::integer;
      t.integer = std::strtoll(digits.c_str(), nullptr, base);
      t.where = where(p);
      out_.push_back(std::move(t));
      return e;
    }
    std::size_t e = lex_digits(p, is_digit);
    bool is_float = false;
    if (!after_dot) {
      if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
        e = lex_digits(e + 1, is_digit);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        std::size_t q = e + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-'))
          ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          e = lex_digits(q, is_digit);
          is_float = true;
        }
      }
    }
    const std::string text = strip(src_.substr(p, e - p));
    token t;
    t.where = where(p);
    if (is_float) {
      t.kind = token_kind::floating;
      t.floating = std::strtod(text.c_str(), nullptr);
    } else {
      t.kind = token_kind::integer;
      errno = 0;
      t.integer = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE)
        throw template_error(error_kind::unsupported, "integer literal " + text + " is too large",
                             t.where);
    }
    out_.push_back(std::move(t));
    return e;
  }

  std::string_view src_;
  std::vector<std::size_t> line_starts_;
  std::vector<token> out_;
};

} // namespace

std::vector<token> tokenize(std::string_view source) {
  return lexer(source).run();
}

} // namespace rlforge::chat::detail
