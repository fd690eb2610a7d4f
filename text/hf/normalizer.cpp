#include "text/hf/normalizer.hpp"

#include <vector>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/pattern.hpp"
#include "text/unicode/normalization.hpp"
#include "text/unicode/properties.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::hf {

namespace {

class unicode_form final : public normalizer {
public:
  explicit unicode_form(unicode::normal_form form) : form_(form) {}
  void normalize(std::string& s, bool&) const override { s = unicode::normalize(s, form_); }

private:
  unicode::normal_form form_;
};

class sequence final : public normalizer {
public:
  explicit sequence(std::vector<std::unique_ptr<const normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& s, bool& start_kept) const override {
    for (const auto& step : steps_)
      step->normalize(s, start_kept);
  }

private:
  std::vector<std::unique_ptr<const normalizer>> steps_;
};

class prepend final : public normalizer {
public:
  explicit prepend(std::string text) : text_(std::move(text)) {}
  void normalize(std::string& s, bool&) const override {
    // HF prepends only to a non-empty string.
    if (!s.empty())
      s.insert(0, text_);
  }

private:
  std::string text_;
};

class replace final : public normalizer {
public:
  replace(pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void normalize(std::string& s, bool& start_kept) const override {
    std::vector<unicode::match_span> matches;
    pattern_.find_all(s, matches);
    if (matches.empty())
      return;
    if (content_.empty() && matches.front().begin == 0 && matches.front().end > 0)
      start_kept = false;
    std::string out;
    out.reserve(s.size() + matches.size() * content_.size());
    size_t last = 0;
    for (const auto& m : matches) {
      out.append(s, last, m.begin - last);
      out.append(content_);
      last = m.end;
    }
    out.append(s, last, std::string::npos);
    s = std::move(out);
  }

private:
  pattern pattern_;
  std::string content_;
};

class lowercase final : public normalizer {
public:
  void normalize(std::string& s, bool&) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      auto b = static_cast<unsigned char>(s[i]);
      if (b < 0x80) {
        out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + ('a' - 'A') : b));
        ++i;
        continue;
      }
      unicode::append_lowercase(out, unicode::next_code_point(s, i));
    }
    s = std::move(out);
  }
};

class strip final : public normalizer {
public:
  strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s, bool& start_kept) const override {
    size_t begin = 0;
    size_t end = s.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!unicode::is_white_space(unicode::next_code_point(s, next)))
          break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
          --start;
        size_t probe = start;
        if (!unicode::is_white_space(unicode::next_code_point(s, probe)))
          break;
        end = start;
      }
    }
    if (begin > 0)
      start_kept = false;
    s = s.substr(begin, end - begin);
  }

private:
  bool left_;
  bool right_;
};

class strip_accents final : public normalizer {
public:
  void normalize(std::string& s, bool& start_kept) const override {
    std::string out;
    out.reserve(s.size());
    bool first = true;
    for (size_t i = 0; i < s.size();) {
      size_t start = i;
      char32_t c = unicode::next_code_point(s, i);
      if (unicode::is_combining_mark(c)) {
        if (first)
          start_kept = false;
        continue;
      }
      first = false;
      out.append(s, start, i - start);
    }
    s = std::move(out);
  }
};

} // namespace

std::unique_ptr<const normalizer> make_normalizer(const json& j, const std::string& where) {
  std::string type = type_of(j, where);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    require_known_fields(j, {"type"}, where);
    auto form = type == "NFC"    ? unicode::normal_form::nfc
                : type == "NFD"  ? unicode::normal_form::nfd
                : type == "NFKC" ? unicode::normal_form::nfkc
                                 : unicode::normal_form::nfkd;
    return std::make_unique<unicode_form>(form);
  }
  if (type == "Sequence") {
    require_known_fields(j, {"type", "normalizers"}, where);
    const json& list = require(j, "normalizers", where);
    std::string list_where = path(where, "normalizers");
    if (!list.is_array())
      fail(list_where + ": expected an array, got " + describe(list));
    std::vector<std::unique_ptr<const normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_normalizer(list[i], path(list_where, i)));
    return std::make_unique<sequence>(std::move(steps));
  }
  if (type == "Prepend") {
    require_known_fields(j, {"type", "prepend"}, where);
    return std::make_unique<prepend>(get_string(j, "prepend", where));
  }
  if (type == "Replace") {
    require_known_fields(j, {"type", "pattern", "content"}, where);
    auto p = pattern::from_json(require(j, "pattern", where), path(where, "pattern"));
    return std::make_unique<replace>(std::move(p), get_string(j, "content", where));
  }
  if (type == "Lowercase") {
    require_known_fields(j, {"type"}, where);
    return std::make_unique<lowercase>();
  }
  if (type == "Strip") {
    require_known_fields(j, {"type", "strip_left", "strip_right"}, where);
    return std::make_unique<strip>(require_bool(j, "strip_left", where),
                                   require_bool(j, "strip_right", where));
  }
  if (type == "StripAccents") {
    require_known_fields(j, {"type"}, where);
    return std::make_unique<strip_accents>();
  }
  fail(where + ": unsupported normalizer type \"" + type +
       "\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, "
       "Sequence)");
}

} // namespace rlforge::text::hf
