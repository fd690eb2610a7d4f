#include "text/hf/word_cache.hpp"

#include <atomic>
#include <functional>
#include <memory>
#include <utility>

namespace rlforge::text::hf {

namespace {

// How many models' caches one thread keeps (most recently used first).
constexpr size_t kept_models = 4;

} // namespace

const std::vector<int32_t>* word_cache::find(std::string_view word) const noexcept {
  const slot& s = table_[std::hash<std::string_view>{}(word) & (slots - 1)];
  return s.used && s.word == word ? &s.ids : nullptr;
}

void word_cache::store(std::string_view word, const int32_t* ids, size_t n) {
  slot& s = table_[std::hash<std::string_view>{}(word) & (slots - 1)];
  s.word.assign(word);
  s.ids.assign(ids, ids + n);
  s.used = true;
}

word_cache& word_cache::for_model(uint64_t model) {
  thread_local std::vector<std::pair<uint64_t, std::unique_ptr<word_cache>>> caches;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i].first != model)
      continue;
    if (i != 0)
      std::swap(caches[i], caches[0]);
    return *caches[0].second;
  }
  if (caches.size() == kept_models)
    caches.pop_back();
  caches.emplace(caches.begin(), model, std::make_unique<word_cache>());
  return *caches[0].second;
}

uint64_t word_cache::next_model_id() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

} // namespace rlforge::text::hf
