#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rlforge::backends {
class causal_lm;
} // namespace rlforge::backends

namespace rlforge::actors {

/// Process-wide sharing of frozen base weights: models built from the same Hugging Face
/// directory whose base weights are frozen (LoRA on) hold ONE copy of those tensors.
///
/// `share_frozen_base(model, hf_dir)` looks up the entry of `hf_dir` (its canonical path plus
/// the weights' dtype). Without a live entry, the model's frozen parameters become the entry;
/// otherwise each frozen parameter of the model is pointed at the entry's tensor of the same
/// name (same shape, dtype and device; the model's own copy is freed and, with glibc, returned to
/// the system), so their storages are equal.
/// Trainable parameters (adapters, value head) are never shared. The entry lives as long as
/// one of the returned handles does: the caller keeps the handle with the model and drops it
/// with the model; the last drop frees the shared weights. Nobody may write the shared tensors
/// (they are frozen: no optimizer touches them).
///
/// Thread-safety: callable from any thread (one process-wide mutex).
std::shared_ptr<const void> share_frozen_base(backends::causal_lm& model,
                                              const std::string& hf_dir);

/// Number of live handles of `hf_dir`'s entry (0 when none): how many models share it.
int64_t shared_base_users(const std::string& hf_dir);

/// Bytes of the distinct storages of `hf_dir`'s entry (0 when none).
int64_t shared_base_bytes(const std::string& hf_dir);

} // namespace rlforge::actors
