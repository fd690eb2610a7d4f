#include "text/hf/added_vocabulary.hpp"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/normalizer.hpp"
#include "text/unicode/properties.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::hf {

// A byte trie over token spellings with leftmost-longest search.
class added_vocabulary::trie {
public:
  void add(std::string_view word, size_t token) {
    if (nodes_.empty())
      nodes_.emplace_back();
    uint32_t at = 0;
    for (char ch : word) {
      auto byte = static_cast<uint8_t>(ch);
      uint32_t child = step(at, byte);
      if (child == none) {
        child = static_cast<uint32_t>(nodes_.size());
        nodes_[at].children.emplace_back(byte, child);
        std::sort(nodes_[at].children.begin(), nodes_[at].children.end());
        nodes_.emplace_back();
      }
      at = child;
    }
    nodes_[at].token = static_cast<int64_t>(token);
    first_bytes_[static_cast<uint8_t>(word[0])] = true;
  }

  // The leftmost-longest match starting at or after `from`: {begin, end, token}, or begin == npos.
  struct found {
    size_t begin;
    size_t end;
    size_t token;
  };
  found next(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_bytes_[static_cast<uint8_t>(text[i])])
        continue;
      uint32_t at = 0;
      int64_t best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < text.size(); ++j) {
        at = step(at, static_cast<uint8_t>(text[j]));
        if (at == none)
          break;
        if (nodes_[at].token >= 0) {
          best = nodes_[at].token;
          best_end = j + 1;
        }
      }
      if (best >= 0)
        return {i, best_end, static_cast<size_t>(best)};
    }
    return {std::string_view::npos, 0, 0};
  }

private:
  static constexpr uint32_t none = ~uint32_t{0};
  struct node {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    int64_t token = -1;
  };
  uint32_t step(uint32_t at, uint8_t byte) const {
    const auto& c = nodes_[at].children;
    auto it = std::lower_bound(c.begin(), c.end(), std::make_pair(byte, uint32_t{0}));
    return it != c.end() && it->first == byte ? it->second : none;
  }
  std::vector<node> nodes_;
  std::array<bool, 256> first_bytes_{};
};

namespace {

bool ends_with_word(std::string_view s) {
  return !s.empty() && unicode::is_word_char(unicode::last_code_point(s));
}

bool starts_with_word(std::string_view s) {
  size_t at = 0;
  return !s.empty() && unicode::is_word_char(unicode::next_code_point(s, at));
}

// Start of the run of whitespace that ends `s` (s.size() when none).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
      --start;
    size_t probe = start;
    if (!unicode::is_white_space(unicode::next_code_point(s, probe)))
      break;
    end = start;
  }
  return end;
}

// Length of the run of whitespace that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t at = 0;
  while (at < s.size()) {
    size_t next = at;
    if (!unicode::is_white_space(unicode::next_code_point(s, next)))
      break;
    at = next;
  }
  return at;
}

} // namespace

std::vector<added_token> parse_added_tokens(const json& j, const std::string& where) {
  if (!j.is_array())
    fail(where + ": expected an array, got " + describe(j));
  std::vector<added_token> out;
  std::unordered_map<std::string, int32_t> ids;
  std::unordered_map<int32_t, std::string> contents;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string w = path(where, i);
    const json& e = j[i];
    require_known_fields(
        e, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}, w);
    added_token t;
    t.id = static_cast<int32_t>(get_int(e, "id", 0, INT32_MAX - 1, w));
    t.content = get_string(e, "content", w);
    t.single_word = get_bool(e, "single_word", false, w);
    t.lstrip = get_bool(e, "lstrip", false, w);
    t.rstrip = get_bool(e, "rstrip", false, w);
    t.special = get_bool(e, "special", false, w);
    // HF's default: special tokens are not normalized, others are.
    t.normalized = get_bool(e, "normalized", !t.special, w);
    if (auto it = ids.find(t.content); it != ids.end()) {
      if (it->second != t.id)
        fail(w + ": \"" + t.content + "\" already has id " + std::to_string(it->second) +
             ", here " + std::to_string(t.id));
      continue;
    }
    if (auto it = contents.find(t.id); it != contents.end())
      fail(w + ": id " + std::to_string(t.id) + " is given to both \"" + it->second + "\" and \"" +
           t.content + "\"");
    ids.emplace(t.content, t.id);
    contents.emplace(t.id, t.content);
    out.push_back(std::move(t));
  }
  return out;
}

added_vocabulary::added_vocabulary(std::vector<added_token> tokens, const normalizer* n)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const added_token& t = tokens_[i];
    by_id_.emplace(t.id, i);
    by_content_.emplace(t.content, t.id);
    // HF ignores added tokens with empty content.
    if (t.content.empty())
      continue;
    if (!t.normalized) {
      if (!raw_trie_)
        raw_trie_ = std::make_unique<trie>();
      raw_trie_->add(t.content, i);
      continue;
    }
    std::string form = t.content;
    if (n != nullptr) {
      bool kept = true;
      n->normalize(form, kept);
      if (form != t.content)
        normalized_forms_.emplace(t.id, form);
    }
    if (form.empty())
      continue;
    if (!normalized_trie_)
      normalized_trie_ = std::make_unique<trie>();
    normalized_trie_->add(form, i);
  }
}

added_vocabulary::~added_vocabulary() = default;

void added_vocabulary::split(std::string_view text, const trie* t,
                             std::vector<section>& out) const {
  if (t == nullptr) {
    if (!text.empty())
      out.push_back({text, -1, 0});
    return;
  }
  // HF's AddedVocabulary::find_matches: leftmost-longest matches, then the token's flags.
  size_t start_offset = 0;
  for (size_t from = 0;;) {
    auto m = t->next(text, from);
    if (m.begin == std::string_view::npos)
      break;
    from = m.end;
    const added_token& tok = tokens_[m.token];
    size_t start = m.begin;
    size_t stop = m.end;
    if (tok.single_word) {
      bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space)
        continue;
    }
    if (tok.lstrip)
      start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (tok.rstrip)
      stop += leading_space_length(text.substr(stop));
    // A token whose content starts with whitespace may begin inside what an rstrip token before
    // it swallowed; HF would emit overlapping text there, this keeps the sections disjoint.
    start = std::max(start, start_offset);
    if (start_offset < start)
      out.push_back({text.substr(start_offset, start - start_offset), -1, start_offset});
    out.push_back({text.substr(start, stop - start), tok.id, start});
    start_offset = stop;
  }
  if (start_offset < text.size())
    out.push_back({text.substr(start_offset), -1, start_offset});
}

void added_vocabulary::split_raw(std::string_view text, std::vector<section>& out) const {
  split(text, raw_trie_.get(), out);
}

void added_vocabulary::split_normalized(std::string_view text, std::vector<section>& out) const {
  split(text, normalized_trie_.get(), out);
}

const added_token* added_vocabulary::find(int32_t id) const noexcept {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> added_vocabulary::id_of(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end())
    return std::nullopt;
  return it->second;
}

const std::string& added_vocabulary::decode_form(int32_t id) const {
  auto it = normalized_forms_.find(id);
  if (it != normalized_forms_.end())
    return it->second;
  return tokens_[by_id_.at(id)].content;
}

} // namespace rlforge::text::hf
