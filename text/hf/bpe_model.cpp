#include "text/hf/bpe_model.hpp"

#include <algorithm>
#include <climits>
#include <queue>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/word_cache.hpp"
#include "text/unicode/byte_level.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::hf {

namespace {

constexpr int32_t no_rank = INT32_MAX;
// Words up to this many symbols merge by scanning their pair ranks; longer ones use a heap.
constexpr size_t linear_merge_limit = 64;

uint64_t mix(uint64_t k) noexcept {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

uint64_t pair_key(int32_t a, int32_t b) noexcept {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string byte_token(unsigned b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
}

} // namespace

void bpe_model::pair_map::reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < n * 2)
    capacity *= 2;
  slots_.assign(capacity, slot{empty, {0, 0}});
  mask_ = capacity - 1;
  size_ = 0;
}

void bpe_model::pair_map::insert(int32_t a, int32_t b, merge m) {
  uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    slot& s = slots_[i];
    if (s.key == empty) {
      s = slot{key, m};
      ++size_;
      return;
    }
    if (s.key == key) {
      // A merge listed twice keeps its last rank, as a map built from the list does in HF.
      s.value = m;
      return;
    }
  }
}

const bpe_model::merge* bpe_model::pair_map::find(int32_t a, int32_t b) const noexcept {
  uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    const slot& s = slots_[i];
    if (s.key == key)
      return &s.value;
    if (s.key == empty)
      return nullptr;
  }
}

std::unique_ptr<const bpe_model> bpe_model::from_json(const json& j, const std::string& where) {
  std::string type = type_of(j, where);
  if (type != "BPE")
    fail(path(where, "type") + ": unsupported model type \"" + type + "\" (supported: BPE)");
  require_known_fields(j,
                       {"type", "dropout", "unk_token", "continuing_subword_prefix",
                        "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges", "vocab",
                        "merges"},
                       where);
  std::unique_ptr<bpe_model> m(new bpe_model());
  m->cache_id_ = word_cache::next_model_id();

  if (const json* d = find(j, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number())
      fail(path(where, "dropout") + ": expected a number or null, got " + describe(*d));
    double p = d->get<double>();
    if (!(p >= 0.0 && p <= 1.0))
      fail(path(where, "dropout") + ": " + d->dump() + " is outside [0, 1]");
    if (p > 0.0)
      fail(path(where, "dropout") + ": BPE dropout " + d->dump() +
           " is not supported (it makes encoding random)");
  }
  m->unk_token_ = get_optional_string(j, "unk_token", where);
  m->prefix_ = get_optional_string(j, "continuing_subword_prefix", where).value_or("");
  m->suffix_ = get_optional_string(j, "end_of_word_suffix", where).value_or("");
  m->fuse_unk_ = get_bool(j, "fuse_unk", false, where);
  m->byte_fallback_ = get_bool(j, "byte_fallback", false, where);
  m->ignore_merges_ = get_bool(j, "ignore_merges", false, where);

  // The vocabulary.
  const json& vocab = require(j, "vocab", where);
  std::string vocab_where = path(where, "vocab");
  if (!vocab.is_object())
    fail(vocab_where + ": expected an object mapping tokens to ids, got " + describe(vocab));
  int32_t bound = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const json& id = it.value();
    if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() >= INT32_MAX) ||
        id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX)
      fail(path(vocab_where, it.key()) + ": expected an id in [0, 2^31 - 1), got " + id.dump());
    bound = std::max(bound, static_cast<int32_t>(id.get<int64_t>()) + 1);
  }
  m->tokens_.assign(static_cast<size_t>(bound), std::string());
  m->assigned_.assign(static_cast<size_t>(bound), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    auto id = static_cast<int32_t>(it.value().get<int64_t>());
    if (m->assigned_[id])
      fail(vocab_where + ": id " + std::to_string(id) + " is given to both \"" + m->tokens_[id] +
           "\" and \"" + it.key() + "\"");
    m->tokens_[id] = it.key();
    m->assigned_[id] = true;
  }
  m->vocab_.reserve(vocab.size());
  for (size_t id = 0; id < m->tokens_.size(); ++id)
    if (m->assigned_[id])
      m->vocab_.emplace(m->tokens_[id], static_cast<int32_t>(id));

  // The merges, "a b" strings or ["a", "b"] pairs (never a mix).
  const json& merges = require(j, "merges", where);
  std::string merges_where = path(where, "merges");
  if (!merges.is_array())
    fail(merges_where + ": expected an array, got " + describe(merges));
  bool pairs = !merges.empty() && merges.front().is_array();
  m->merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    std::string e_where = path(merges_where, i);
    std::string a, b;
    if (pairs) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
        fail(e_where + ": expected a pair of strings like the first merge, got " + e.dump());
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      if (!e.is_string())
        fail(e_where + ": expected a string \"a b\" like the first merge, got " + e.dump());
      const std::string& s = e.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail(e_where + ": \"" + s + "\" is not two tokens separated by one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    }
    auto ia = m->vocab_.find(a);
    auto ib = m->vocab_.find(b);
    if (ia == m->vocab_.end())
      fail(e_where + ": token \"" + a + "\" is not in the vocabulary");
    if (ib == m->vocab_.end())
      fail(e_where + ": token \"" + b + "\" is not in the vocabulary");
    if (b.size() < m->prefix_.size())
      fail(e_where + ": token \"" + b + "\" is shorter than continuing_subword_prefix");
    std::string merged = a + b.substr(m->prefix_.size());
    auto im = m->vocab_.find(merged);
    if (im == m->vocab_.end())
      fail(e_where + ": the merged token \"" + merged + "\" is not in the vocabulary");
    m->merges_.insert(ia->second, ib->second, merge{static_cast<int32_t>(i), im->second});
  }

  if (m->unk_token_) {
    auto it = m->vocab_.find(*m->unk_token_);
    if (it == m->vocab_.end())
      fail(path(where, "unk_token") + ": \"" + *m->unk_token_ + "\" is not in the vocabulary");
    m->unk_id_ = it->second;
  }

  // Lookup tables for the hot paths.
  if (m->prefix_.empty() && m->suffix_.empty()) {
    m->bmp_ids_.assign(0x10000, -1);
    for (const auto& [token, id] : m->vocab_) {
      if (token.empty() || token.size() > 3)
        continue;
      size_t at = 0;
      char32_t c = unicode::next_code_point(token, at);
      if (at == token.size() && c < 0x10000)
        m->bmp_ids_[c] = id;
    }
  }
  bool all_bytes = true;
  for (unsigned b = 0; b < 256; ++b) {
    auto f = m->vocab_.find(byte_token(b));
    m->fallback_ids_[b] = f == m->vocab_.end() ? -1 : f->second;
    auto c = m->vocab_.find(std::string(unicode::byte_to_utf8(static_cast<uint8_t>(b))));
    m->byte_char_ids_[b] = c == m->vocab_.end() ? -1 : c->second;
    all_bytes = all_bytes && c != m->vocab_.end();
  }
  m->reads_raw_bytes_ = all_bytes && m->prefix_.empty() && m->suffix_.empty();
  if (m->reads_raw_bytes_ && m->ignore_merges_) {
    m->raw_vocab_.reserve(m->vocab_.size());
    for (const auto& [token, id] : m->vocab_) {
      std::string raw;
      raw.reserve(token.size());
      bool ok = true;
      for (size_t at = 0; at < token.size() && ok;) {
        int byte = unicode::char_to_byte(unicode::next_code_point(token, at));
        ok = byte >= 0;
        raw.push_back(static_cast<char>(byte));
      }
      if (ok)
        m->raw_vocab_.emplace(m->raw_spellings_.emplace_back(std::move(raw)), id);
    }
  }
  return m;
}

int32_t bpe_model::char_id(std::string_view s, bool first, bool last, std::string& scratch) const {
  bool decorate = (!first && !prefix_.empty()) || (last && !suffix_.empty());
  if (!decorate) {
    if (!bmp_ids_.empty() && s.size() <= 3) {
      size_t at = 0;
      char32_t c = unicode::next_code_point(s, at);
      if (c < 0x10000)
        return bmp_ids_[c];
    }
    scratch.assign(s);
  } else {
    scratch.clear();
    if (!first)
      scratch.append(prefix_);
    scratch.append(s);
    if (last)
      scratch.append(suffix_);
  }
  auto it = vocab_.find(std::string_view(scratch));
  return it == vocab_.end() ? -1 : it->second;
}

void bpe_model::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty())
    return;
  if (word.size() > word_cache::max_word) {
    tokenize_uncached(word, out);
    return;
  }
  word_cache& cache = word_cache::for_model(cache_id_);
  if (const auto* hit = cache.find(word)) {
    out.insert(out.end(), hit->begin(), hit->end());
    return;
  }
  size_t start = out.size();
  tokenize_uncached(word, out);
  cache.store(word, out.data() + start, out.size() - start);
}

void bpe_model::tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  std::string scratch;
  bool pending_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t next = i + unicode::sequence_length(static_cast<unsigned char>(word[i]));
    std::string_view s = word.substr(i, next - i);
    bool first = i == 0;
    bool last = next >= word.size();
    i = next;
    int32_t id = char_id(s, first, last, scratch);
    if (id >= 0) {
      if (pending_unk) {
        symbols.push_back(unk_id_);
        pending_unk = false;
      }
      symbols.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      // HF falls back on the bytes of the character as looked up, with its prefix or suffix. A
      // pending unknown is not flushed here, as in HF.
      scratch.clear();
      if (!first)
        scratch.append(prefix_);
      scratch.append(s);
      if (last)
        scratch.append(suffix_);
      bool all = true;
      for (char c : scratch)
        all = all && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : scratch)
          symbols.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_)
        symbols.push_back(unk_id_);
      pending_unk = true;
    }
    // Without an unk_token HF drops the character.
  }
  if (pending_unk)
    symbols.push_back(unk_id_);
  merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void bpe_model::tokenize_raw(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.size() <= 1 || raw.size() > word_cache::max_word) {
    tokenize_raw_uncached(raw, out);
    return;
  }
  word_cache& cache = word_cache::for_model(cache_id_);
  if (const auto* hit = cache.find(raw)) {
    out.insert(out.end(), hit->begin(), hit->end());
    return;
  }
  size_t start = out.size();
  tokenize_raw_uncached(raw, out);
  cache.store(raw, out.data() + start, out.size() - start);
}

void bpe_model::tokenize_raw_uncached(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty())
    return;
  if (ignore_merges_) {
    auto it = raw_vocab_.find(raw);
    if (it != raw_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (raw.size() == 1) {
    out.push_back(byte_char_ids_[static_cast<unsigned char>(raw[0])]);
    return;
  }
  std::vector<int32_t> symbols(raw.size());
  for (size_t i = 0; i < raw.size(); ++i)
    symbols[i] = byte_char_ids_[static_cast<unsigned char>(raw[i])];
  merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void bpe_model::merge_symbols(std::vector<int32_t>& symbols) const {
  size_t n = symbols.size();
  if (n < 2)
    return;
  if (n > linear_merge_limit) {
    merge_symbols_heap(symbols);
    return;
  }
  // rank[i], result[i]: the merge of symbols i and i + 1. The lowest rank merges first, the
  // leftmost among equal ranks: the order HF's heap of (rank, position) gives.
  int32_t rank[linear_merge_limit];
  int32_t result[linear_merge_limit];
  auto look = [&](size_t i) {
    const merge* m = merges_.find(symbols[i], symbols[i + 1]);
    rank[i] = m ? m->rank : no_rank;
    result[i] = m ? m->new_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i)
    look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best])
        best = i;
    if (rank[best] == no_rank)
      break;
    symbols[best] = result[best];
    for (size_t i = best + 1; i + 1 < n; ++i)
      symbols[i] = symbols[i + 1];
    for (size_t i = best; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    --n;
    if (best > 0)
      look(best - 1);
    if (best + 1 < n)
      look(best);
  }
  symbols.resize(n);
}

void bpe_model::merge_symbols_heap(std::vector<int32_t>& symbols) const {
  struct entry {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto n = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  std::vector<entry> storage;
  storage.reserve(n);
  std::priority_queue<entry, std::vector<entry>, std::greater<entry>> queue(std::greater<entry>(),
                                                                            std::move(storage));
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n)
      if (const merge* m = merges_.find(symbols[i], symbols[i + 1]))
        queue.push({m->rank, i, m->new_id});
  }
  while (!queue.empty()) {
    entry top = queue.top();
    queue.pop();
    int32_t pos = top.pos;
    if (!alive[pos] || next[pos] < 0)
      continue;
    int32_t right = next[pos];
    // Skip entries made stale by earlier merges.
    const merge* current = merges_.find(symbols[pos], symbols[right]);
    if (current == nullptr || current->new_id != top.new_id)
      continue;
    symbols[pos] = top.new_id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[right] >= 0)
      prev[next[right]] = pos;
    if (prev[pos] >= 0)
      if (const merge* m = merges_.find(symbols[prev[pos]], symbols[pos]))
        queue.push({m->rank, prev[pos], m->new_id});
    if (next[pos] >= 0)
      if (const merge* m = merges_.find(symbols[pos], symbols[next[pos]]))
        queue.push({m->rank, pos, m->new_id});
  }
  size_t kept = 0;
  for (int32_t i = 0; i < n; ++i)
    if (alive[i])
      symbols[kept++] = symbols[i];
  symbols.resize(kept);
}

std::optional<int32_t> bpe_model::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end())
    return std::nullopt;
  return it->second;
}

const std::string* bpe_model::id_to_token(int32_t id) const noexcept {
  if (id < 0 || id >= id_bound() || !assigned_[id])
    return nullptr;
  return &tokens_[id];
}

} // namespace rlforge::text::hf
