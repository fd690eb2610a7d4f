#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace rlforge::backends {
class causal_lm;
} // namespace rlforge::backends

namespace rlforge::actors {

/// The weight versions an inference engine can run: the live weights in its model (version
/// `current()`) and copies of older versions, kept either because they are retained
/// (`retain`, LRU-bounded, for `generate` calls that name them) or because requests pinned to
/// them are still running (`before_change`; dropped by `drop_unused` once none is).
///
/// Ownership: holds the copies; the model belongs to the engine state (`reset` points at it).
/// Thread-safety: none; the engine rank's thread only.
class engine_weights {
public:
  /// A new model at version 0: forgets every copy.
  void reset(backends::causal_lm* model);

  int64_t current() const { return current_; }
  void set_current(int64_t version) { current_ = version; }

  /// Whether new requests may name `version`: the current one, or a retained copy.
  bool available(int64_t version) const;

  /// Marks `version` used now (for the LRU bound of retained copies).
  void touch(int64_t version);

  /// Keeps the current weights (which must be `version` >= 1) addressable after newer weights
  /// arrive, at most `max_retained` versions; returns the versions evicted (least recently used
  /// first, never the current one). Throws `backends::error(invalid_argument)` otherwise.
  std::vector<int64_t> retain(int64_t version, int64_t max_retained);

  /// Before the live weights change: copies them when the current version is retained or
  /// `in_use(current())` (requests pinned to it are still running).
  void before_change(const std::function<bool(int64_t)>& in_use);

  /// Drops copies of versions that are neither retained nor current nor `in_use`.
  void drop_unused(const std::function<bool(int64_t)>& in_use);

  /// Runs `f` with the weights of `version` in the model (0 or the current version: the live
  /// ones; otherwise a copy, swapped in for the call and back out, also when `f` throws).
  /// Throws `backends::error(not_found)` when no copy of `version` exists.
  template <class F> auto with(int64_t version, F&& f) -> decltype(f()) {
    if (version == 0 || version == current_)
      return f();
    swap_in(version);
    struct restore {
      engine_weights* self;
      ~restore() { self->swap_out(); }
    } guard{this};
    return f();
  }

  /// Bytes held in copies.
  int64_t bytes() const;

  int64_t max_retained() const { return max_retained_; }

private:
  struct copy {
    std::map<std::string, at::Tensor> weights; ///< empty while the version is the current one
    bool retained = false;
    uint64_t last_used = 0;
  };

  void swap_in(int64_t version);
  void swap_out();

  backends::causal_lm* model_ = nullptr;
  int64_t current_ = 0;
  std::map<int64_t, copy> copies_;
  int64_t max_retained_ = 0;
  uint64_t clock_ = 0;
  std::map<std::string, at::Tensor> live_; ///< the live weights while a copy is swapped in
};

} // namespace rlforge::actors
