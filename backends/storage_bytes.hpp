#pragma once

#include <cstdint>
#include <unordered_set>

#include <ATen/core/Tensor.h>

namespace rlforge::backends {

/// Bytes of the distinct storages behind `tensors` (a range of (name, tensor) pairs): a storage
/// already in `seen` (from this or an earlier call) counts 0, so tied or shared tensors count
/// once; undefined tensors and tensors without storage (emptied by an offload) count 0. What the
/// engines' and workers' `memory` ops report as resident or host bytes.
template <class Range>
int64_t storage_bytes(const Range& tensors, std::unordered_set<const void*>& seen) {
  int64_t bytes = 0;
  for (auto& [name, t] : tensors) {
    if (!t.defined() || !t.has_storage())
      continue;
    const auto& storage = t.storage();
    if (seen.insert(storage.unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(storage.nbytes());
  }
  return bytes;
}

/// The same with a fresh `seen` set.
template <class Range>
int64_t storage_bytes(const Range& tensors) {
  std::unordered_set<const void*> seen;
  return storage_bytes(tensors, seen);
}

} // namespace rlforge::backends
