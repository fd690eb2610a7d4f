#include "chat/strings.hpp"

#include <algorithm>

#include "chat/unicode.hpp"

namespace rlforge::chat::detail {

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  const std::u32string cps = decode_utf8(s);
  std::u32string set;
  if (chars)
    set = decode_utf8(*chars);
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_space(c);
  };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b]))
      ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1]))
      --e;
  return encode_utf8(std::u32string_view(cps).substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right, source_position where) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty())
      throw template_error(error_kind::runtime, "split: empty separator", where);
    if (!from_right) {
      std::size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        const std::size_t hit = s.find(*sep, start);
        if (hit == std::string_view::npos)
          break;
        out.emplace_back(s.substr(start, hit - start));
        start = hit + sep->size();
      }
      out.emplace_back(s.substr(start));
      return out;
    }
    std::size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size())
        break;
      const std::size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos)
        break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Whitespace runs; no empty strings at either end.
  const std::u32string cps = decode_utf8(s);
  const std::size_t n = cps.size();
  if (!from_right) {
    std::size_t i = 0;
    while (true) {
      while (i < n && is_space(cps[i]))
        ++i;
      if (i == n)
        break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(encode_utf8(std::u32string_view(cps).substr(i)));
        break;
      }
      std::size_t j = i;
      while (j < n && !is_space(cps[j]))
        ++j;
      out.push_back(encode_utf8(std::u32string_view(cps).substr(i, j - i)));
      i = j;
    }
    return out;
  }
  std::size_t e = n;
  while (true) {
    while (e > 0 && is_space(cps[e - 1]))
      --e;
    if (e == 0)
      break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode_utf8(std::u32string_view(cps).substr(0, e)));
      break;
    }
    std::size_t b = e;
    while (b > 0 && !is_space(cps[b - 1]))
      --b;
    out.push_back(encode_utf8(std::u32string_view(cps).substr(b, e - b)));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count) {
  std::string out;
  if (count == 0)
    return std::string(s);
  if (old.empty()) {
    // Python inserts the replacement before every code point and at the end.
    const std::u32string cps = decode_utf8(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      append_utf8(out, c);
    }
    if (count < 0 || done < count)
      out += replacement;
    return out;
  }
  std::size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const std::size_t hit = s.find(old, start);
    if (hit == std::string_view::npos)
      break;
    out += s.substr(start, hit - start);
    out += replacement;
    start = hit + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

std::string py_case(std::string_view s, bool upper, source_position where) {
  std::string out(s);
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80)
      throw template_error(error_kind::unsupported,
                           std::string(upper ? "upper" : "lower") +
                               " of text with non-ASCII characters is not supported",
                           where);
    if (upper && c >= 'a' && c <= 'z')
      c = static_cast<char>(c - 'a' + 'A');
    if (!upper && c >= 'A' && c <= 'Z')
      c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

} // namespace rlforge::chat::detail
