#include "backends/storage_copier.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

namespace rlforge::backends {

at::Tensor storage_copier::operator()(const at::Tensor& t) {
  c10::NoGradGuard no_grad;
  const auto& src = t.storage();
  auto i = copies_.find(src.unsafeGetStorageImpl());
  if (i == copies_.end()) {
    auto bytes = static_cast<int64_t>(src.nbytes());
    auto byte_options = at::TensorOptions().dtype(at::kByte);
    auto from = at::empty({0}, byte_options.device(t.device())).set_(src, 0, {bytes}, {1});
    bool pinned = t.is_cuda() && to_.is_cpu();
    auto to = at::empty({bytes}, byte_options.device(to_).pinned_memory(pinned));
    to.copy_(from);
    i = copies_.emplace(src.unsafeGetStorageImpl(), to.storage()).first;
  }
  return at::empty({0}, t.options().device(to_))
      .set_(i->second, t.storage_offset(), t.sizes(), t.strides());
}

} // namespace rlforge::backends
