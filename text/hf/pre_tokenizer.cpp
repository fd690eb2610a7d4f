#include "text/hf/pre_tokenizer.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/pattern.hpp"
#include "text/unicode/byte_level.hpp"
#include "text/unicode/regex.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::hf {

namespace {

// GPT-2's split, which ByteLevel applies when `use_regex` is true.
const unicode::regex& gpt2_regex() {
  static const unicode::regex r = unicode::regex::compile(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "ByteLevel");
  return r;
}

// The spans of `text` found by `matches`, covering it in order, as HF's Pattern::find_matches.
std::vector<split_span> cover(std::string_view text,
                              const std::vector<unicode::match_span>& matches, bool invert) {
  std::vector<split_span> spans;
  if (text.empty()) {
    spans.push_back({0, 0, invert});
    return spans;
  }
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& m : matches) {
    if (prev != m.begin)
      spans.push_back({prev, m.begin, invert});
    spans.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != text.size())
    spans.push_back({prev, text.size(), invert});
  return spans;
}

// Replaces piece `p` by its sub-ranges (empty ones dropped, as HF drops empty splits).
void emit(const piece& p, const std::vector<std::pair<size_t, size_t>>& ranges,
          std::vector<piece>& out) {
  for (const auto& [b, e] : ranges)
    if (e > b)
      out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
}

split_behavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed")
    return split_behavior::removed;
  if (s == "Isolated")
    return split_behavior::isolated;
  if (s == "MergedWithPrevious")
    return split_behavior::merged_with_previous;
  if (s == "MergedWithNext")
    return split_behavior::merged_with_next;
  if (s == "Contiguous")
    return split_behavior::contiguous;
  fail(where + ": unknown behavior \"" + s +
       "\" (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

class split final : public pre_tokenizer {
public:
  split(pattern p, split_behavior behavior, bool invert)
      : pattern_(std::move(p)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(pre_tokenized& p) const override {
    std::vector<piece> out;
    out.reserve(p.pieces().size() * 4);
    std::vector<unicode::match_span> matches;
    for (const piece& pc : p.pieces()) {
      matches.clear();
      pattern_.find_all(pc.text, matches);
      emit(pc, apply_behavior(cover(pc.text, matches, invert_), behavior_), out);
    }
    p.pieces() = std::move(out);
  }

private:
  pattern pattern_;
  split_behavior behavior_;
  bool invert_;
};

class byte_level final : public pre_tokenizer {
public:
  byte_level(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}

  void pre_tokenize(pre_tokenized& p) const override {
    pre_tokenize_unmapped(p);
    size_t total = 0;
    for (const piece& pc : p.pieces())
      total += pc.text.size();
    std::string& buffer = p.new_buffer();
    buffer.reserve(total * 2);
    std::vector<std::pair<size_t, size_t>> ranges;
    ranges.reserve(p.pieces().size());
    for (const piece& pc : p.pieces()) {
      size_t begin = buffer.size();
      unicode::append_byte_level(buffer, pc.text);
      ranges.emplace_back(begin, buffer.size());
    }
    // `buffer` no longer grows: the views below stay valid.
    for (size_t i = 0; i < ranges.size(); ++i)
      p.pieces()[i].text =
          std::string_view(buffer).substr(ranges[i].first, ranges[i].second - ranges[i].first);
  }

  bool ends_with_byte_level() const noexcept override { return true; }

  void pre_tokenize_unmapped(pre_tokenized& p) const override {
    if (add_prefix_space_) {
      for (piece& pc : p.pieces()) {
        if (!pc.text.empty() && pc.text.front() == ' ')
          continue;
        std::string& b = p.new_buffer();
        b.reserve(pc.text.size() + 1);
        b.push_back(' ');
        b.append(pc.text);
        pc.text = b;
      }
    }
    if (!use_regex_)
      return;
    std::vector<piece> out;
    out.reserve(p.pieces().size() * 4);
    std::vector<unicode::match_span> matches;
    for (const piece& pc : p.pieces()) {
      matches.clear();
      gpt2_regex().find_all(pc.text, matches);
      emit(pc, apply_behavior(cover(pc.text, matches, false), split_behavior::isolated), out);
    }
    p.pieces() = std::move(out);
  }

private:
  bool add_prefix_space_;
  bool use_regex_;
};

enum class prepend_scheme { always, first, never };

class metaspace final : public pre_tokenizer {
public:
  metaspace(std::string replacement, prepend_scheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}

  void pre_tokenize(pre_tokenized& p) const override {
    std::vector<piece> out;
    for (const piece& pc : p.pieces()) {
      std::string& b = p.new_buffer();
      bool starts = pc.text.substr(0, replacement_.size()) == replacement_ ||
                    (!pc.text.empty() && pc.text.front() == ' ');
      if (!starts &&
          (scheme_ == prepend_scheme::always || (scheme_ == prepend_scheme::first && pc.at_start)))
        b.append(replacement_);
      for (char c : pc.text) {
        if (c == ' ')
          b.append(replacement_);
        else
          b.push_back(c);
      }
      piece whole{b, pc.at_start};
      if (!split_) {
        out.push_back(whole);
        continue;
      }
      std::vector<split_span> spans;
      size_t prev = 0;
      for (size_t at = b.find(replacement_); at != std::string::npos;
           at = b.find(replacement_, at + replacement_.size())) {
        if (prev != at)
          spans.push_back({prev, at, false});
        spans.push_back({at, at + replacement_.size(), true});
        prev = at + replacement_.size();
      }
      if (prev != b.size())
        spans.push_back({prev, b.size(), false});
      emit(whole, apply_behavior(spans, split_behavior::merged_with_next), out);
    }
    p.pieces() = std::move(out);
  }

private:
  std::string replacement_;
  prepend_scheme scheme_;
  bool split_;
};

class sequence final : public pre_tokenizer {
public:
  explicit sequence(std::vector<std::unique_ptr<const pre_tokenizer>> steps)
      : steps_(std::move(steps)) {}

  void pre_tokenize(pre_tokenized& p) const override {
    for (const auto& step : steps_)
      step->pre_tokenize(p);
  }

  bool ends_with_byte_level() const noexcept override {
    return !steps_.empty() && steps_.back()->ends_with_byte_level();
  }

  void pre_tokenize_unmapped(pre_tokenized& p) const override {
    for (size_t i = 0; i + 1 < steps_.size(); ++i)
      steps_[i]->pre_tokenize(p);
    steps_.back()->pre_tokenize_unmapped(p);
  }

private:
  std::vector<std::unique_ptr<const pre_tokenizer>> steps_;
};

} // namespace

pre_tokenized::pre_tokenized(std::string_view text, bool at_start) {
  if (!text.empty())
    pieces_.push_back({text, at_start});
}

std::string& pre_tokenized::new_buffer() {
  return buffers_.emplace_back();
}

void pre_tokenizer::pre_tokenize_unmapped(pre_tokenized&) const {
  fail("pre_tokenize_unmapped called on a pre-tokenizer that does not end with ByteLevel");
}

std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<split_span>& spans,
                                                      split_behavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
  case split_behavior::isolated:
    for (const auto& s : spans)
      out.emplace_back(s.begin, s.end);
    break;
  case split_behavior::removed:
    for (const auto& s : spans)
      if (!s.is_match)
        out.emplace_back(s.begin, s.end);
    break;
  case split_behavior::contiguous:
    for (const auto& s : spans) {
      if (s.is_match == previous_match && !out.empty())
        out.back().second = s.end;
      else
        out.emplace_back(s.begin, s.end);
      previous_match = s.is_match;
    }
    break;
  case split_behavior::merged_with_previous:
    for (const auto& s : spans) {
      if (s.is_match && !previous_match && !out.empty())
        out.back().second = s.end;
      else
        out.emplace_back(s.begin, s.end);
      previous_match = s.is_match;
    }
    break;
  case split_behavior::merged_with_next:
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      if (it->is_match && !previous_match && !out.empty())
        out.back().first = it->begin;
      else
        out.emplace_back(it->begin, it->end);
      previous_match = it->is_match;
    }
    std::reverse(out.begin(), out.end());
    break;
  }
  return out;
}

std::unique_ptr<const pre_tokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  std::string type = type_of(j, where);
  if (type == "Split") {
    require_known_fields(j, {"type", "pattern", "behavior", "invert"}, where);
    auto p = pattern::from_json(require(j, "pattern", where), path(where, "pattern"));
    auto behavior = parse_behavior(get_string(j, "behavior", where), path(where, "behavior"));
    return std::make_unique<split>(std::move(p), behavior, require_bool(j, "invert", where));
  }
  if (type == "ByteLevel") {
    require_known_fields(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, where);
    // trim_offsets only moves offsets, which this library does not produce; it is read so that a
    // malformed value is still refused.
    get_bool(j, "trim_offsets", true, where);
    return std::make_unique<byte_level>(get_bool(j, "add_prefix_space", true, where),
                                        get_bool(j, "use_regex", true, where));
  }
  if (type == "Metaspace") {
    require_known_fields(
        j, {"type", "replacement", "add_prefix_space", "prepend_scheme", "split", "str_rep"},
        where);
    std::string replacement = get_string(j, "replacement", where);
    if (unicode::count_code_points(replacement) != 1)
      fail(path(where, "replacement") + ": expected one character, got \"" + replacement + "\"");
    if (auto rep = get_optional_string(j, "str_rep", where); rep && *rep != replacement)
      fail(path(where, "str_rep") + ": \"" + *rep + "\" differs from replacement \"" + replacement +
           "\"");
    prepend_scheme scheme = prepend_scheme::always;
    if (auto s = get_optional_string(j, "prepend_scheme", where)) {
      if (*s == "always")
        scheme = prepend_scheme::always;
      else if (*s == "first")
        scheme = prepend_scheme::first;
      else if (*s == "never")
        scheme = prepend_scheme::never;
      else
        fail(path(where, "prepend_scheme") + ": unknown scheme \"" + *s +
             "\" (expected always, first or never)");
    }
    if (const json* a = find(j, "add_prefix_space"); a != nullptr && !a->is_null()) {
      // As HF: add_prefix_space false requires prepend_scheme "never" (whose default is
      // "always", so a file with only add_prefix_space false is refused, as HF refuses it).
      if (!get_bool(j, "add_prefix_space", true, where) && scheme != prepend_scheme::never)
        fail(path(where, "add_prefix_space") +
             ": false does not match prepend_scheme (which must then be \"never\")");
    }
    return std::make_unique<metaspace>(replacement, scheme, get_bool(j, "split", true, where));
  }
  if (type == "Sequence") {
    require_known_fields(j, {"type", "pretokenizers"}, where);
    const json& list = require(j, "pretokenizers", where);
    std::string list_where = path(where, "pretokenizers");
    if (!list.is_array())
      fail(list_where + ": expected an array, got " + describe(list));
    std::vector<std::unique_ptr<const pre_tokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_pre_tokenizer(list[i], path(list_where, i)));
    return std::make_unique<sequence>(std::move(steps));
  }
  fail(where + ": unsupported pre_tokenizer type \"" + type +
       "\" (supported: Split, ByteLevel, Metaspace, Sequence)");
}

} // namespace rlforge::text::hf
