#include "actors/engine_weights.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/storage_bytes.hpp"

namespace rlforge::actors {

namespace be = rlforge::backends;

namespace {

/// Puts `weights` into the model's parameters (by name, storage swap, no copy) and returns what
/// they held.
std::map<std::string, at::Tensor> swap_weights(be::causal_lm& model,
                                               const std::map<std::string, at::Tensor>& weights) {
  c10::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> previous;
  for (auto& [name, p] : model.named_parameters()) {
    previous.emplace(name, p.detach());
    p.set_(weights.at(name));
  }
  return previous;
}

} // namespace

void engine_weights::reset(be::causal_lm* model) {
  model_ = model;
  current_ = 0;
  copies_.clear();
  max_retained_ = 0;
  live_.clear();
}

bool engine_weights::available(int64_t version) const {
  if (version == 0 || version == current_)
    return true;
  auto i = copies_.find(version);
  return i != copies_.end() && i->second.retained && !i->second.weights.empty();
}

void engine_weights::touch(int64_t version) {
  auto i = copies_.find(version == 0 ? current_ : version);
  if (i != copies_.end())
    i->second.last_used = ++clock_;
}

std::vector<int64_t> engine_weights::retain(int64_t version, int64_t max_retained) {
  if (max_retained < 1)
    be::fail(be::error_code::invalid_argument,
             "retain_weights: max_retained must be >= 1, got " + std::to_string(max_retained));
  if (version != current_ || version < 1)
    be::fail(be::error_code::invalid_argument,
             "retain_weights: version " + std::to_string(version) +
                 " is not the engine's current weights version " + std::to_string(current_));
  max_retained_ = max_retained;
  auto& c = copies_[version];
  c.retained = true;
  c.last_used = ++clock_;
  std::vector<int64_t> evicted;
  for (;;) {
    int64_t retained = 0;
    auto oldest = copies_.end();
    for (auto i = copies_.begin(); i != copies_.end(); ++i) {
      if (!i->second.retained)
        continue;
      ++retained;
      if (i->first != current_ &&
          (oldest == copies_.end() || i->second.last_used < oldest->second.last_used))
        oldest = i;
    }
    if (retained <= max_retained_ || oldest == copies_.end())
      break;
    evicted.push_back(oldest->first);
    // A copy still serving running requests stays until they finish (drop_unused).
    oldest->second.retained = false;
  }
  return evicted;
}

void engine_weights::before_change(const std::function<bool(int64_t)>& in_use) {
  if (current_ < 1)
    return;
  auto i = copies_.find(current_);
  const bool retained = i != copies_.end() && i->second.retained;
  if (!retained && !in_use(current_))
    return;
  auto& c = copies_[current_];
  if (!c.weights.empty())
    return;
  c10::NoGradGuard no_grad;
  for (auto& [name, p] : model_->named_parameters())
    c.weights.emplace(name, p.detach().clone());
}

void engine_weights::drop_unused(const std::function<bool(int64_t)>& in_use) {
  for (auto i = copies_.begin(); i != copies_.end();) {
    if (!i->second.retained && i->first != current_ && !in_use(i->first))
      i = copies_.erase(i);
    else
      ++i;
  }
}

int64_t engine_weights::bytes() const {
  int64_t n = 0;
  for (auto& [version, c] : copies_)
    n += be::storage_bytes(c.weights);
  return n;
}

void engine_weights::swap_in(int64_t version) {
  auto i = copies_.find(version);
  if (i == copies_.end() || i->second.weights.empty())
    be::fail(be::error_code::not_found, "weights version " + std::to_string(version) +
                                            " are no longer held by this engine (it holds version " +
                                            std::to_string(current_) + ")");
  i->second.last_used = ++clock_;
  live_ = swap_weights(*model_, i->second.weights);
}

void engine_weights::swap_out() {
  if (live_.empty())
    return;
  swap_weights(*model_, live_);
  live_.clear();
}

} // namespace rlforge::actors
