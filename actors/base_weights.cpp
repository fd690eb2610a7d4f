#include "actors/base_weights.hpp"

#include <c10/core/GradMode.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <unordered_set>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ATen/ATen.h>

#include "backends/model/causal_lm.hpp"

namespace rlforge::actors {

namespace {

struct base_entry {
  std::map<std::string, at::Tensor> tensors; ///< frozen parameters by name
};

struct cache {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<base_entry>> entries; ///< key → entry
};

cache& the_cache() {
  static cache c;
  return c;
}

std::string canonical_dir(const std::string& hf_dir) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(hf_dir, ec);
  return ec ? hf_dir : p.string();
}

/// Entries of `hf_dir` under any dtype, with the lock held; expired ones are dropped.
template <class F> void for_each_live(cache& c, const std::string& hf_dir, F f) {
  auto prefix = canonical_dir(hf_dir) + "|";
  for (auto it = c.entries.begin(); it != c.entries.end();) {
    if (it->second.expired()) {
      it = c.entries.erase(it);
      continue;
    }
    if (it->first.compare(0, prefix.size(), prefix) == 0)
      f(it->second);
    ++it;
  }
}

} // namespace

std::shared_ptr<const void> share_frozen_base(backends::causal_lm& model,
                                              const std::string& hf_dir) {
  auto params = model.named_parameters();
  std::string dtype = params.empty() ? "none" : std::string{params.front().second.dtype().name()};
  auto key = canonical_dir(hf_dir) + "|" + dtype;
  auto& c = the_cache();
  std::lock_guard<std::mutex> guard(c.mutex);
  auto entry = c.entries[key].lock();
  if (!entry) {
    entry = std::make_shared<base_entry>();
    for (auto& [name, p] : params)
      if (!p.requires_grad())
        entry->tensors.emplace(name, p.detach()); // an alias: the model may swap its storage
    c.entries[key] = entry;
    return entry;
  }
  c10::NoGradGuard no_grad;
  for (auto& [name, p] : params) {
    if (p.requires_grad())
      continue;
    auto it = entry->tensors.find(name);
    if (it == entry->tensors.end() || !it->second.sizes().equals(p.sizes())
        || it->second.dtype() != p.dtype() || it->second.device() != p.device())
      continue; // not the same base tensor: keep the model's own copy
    p.set_data(it->second);
  }
#if defined(__GLIBC__)
  // The model's own copy was allocated on the loading thread's arena, which would keep it
  // (resident) for later allocations of that thread only: give it back to the system.
  malloc_trim(0);
#endif
  return entry;
}

int64_t shared_base_users(const std::string& hf_dir) {
  auto& c = the_cache();
  std::lock_guard<std::mutex> guard(c.mutex);
  int64_t users = 0;
  for_each_live(c, hf_dir, [&](const std::weak_ptr<base_entry>& w) { users += w.use_count(); });
  return users;
}

int64_t shared_base_bytes(const std::string& hf_dir) {
  auto& c = the_cache();
  std::lock_guard<std::mutex> guard(c.mutex);
  int64_t bytes = 0;
  std::unordered_set<const void*> seen;
  for_each_live(c, hf_dir, [&](const std::weak_ptr<base_entry>& w) {
    if (auto e = w.lock())
      for (auto& [name, t] : e->tensors)
        if (t.has_storage() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
          bytes += static_cast<int64_t>(t.storage().nbytes());
  });
  return bytes;
}

} // namespace rlforge::actors
