#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "backends/train/lr_schedule.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/rng_state.hpp"

namespace rlforge::backends {

/// Version written into every `meta.json` and `trainer_state.json`; loading refuses others.
inline constexpr int64_t checkpoint_format_version = 1;

/// Where one rank's state lives: `root/global_step_N/<role>/rank_<r>/`, holding
/// `model.safetensors` (named parameters), `optimizer.safetensors` (`<name>.exp_avg`,
/// `<name>.exp_avg_sq`) + `optimizer.json` (step counts, last hyper-parameters),
/// `scheduler.json` (`lr_schedule::to_json()` or null), `rng.safetensors` (tensor `torch_cpu`,
/// metadata `std_engine.<name>`) and `meta.json` {format_version, world_size, rank, role,
/// global_step}, written last. Next to the roles, `root/global_step_N/trainer_state.json`;
/// at the root, `latest_global_step.txt`, written after everything else.
struct checkpoint_location {
  std::string root;        ///< DIR
  int64_t global_step = 0; ///< N ≥ 0
  std::string role;        ///< "policy", "critic", "ref", ... (one path component)
  int64_t rank = 0;        ///< in [0, world_size)
  int64_t world_size = 1;  ///< ≥ 1

  /// Throws `error{invalid_argument}` naming the field: empty root, negative step, a role that
  /// is empty, "." / ".." or contains '/', rank outside [0, world_size), world_size < 1.
  void validate() const;
};

/// `root/global_step_N`.
std::string step_directory(const std::string& root, int64_t global_step);

/// `root/global_step_N/<role>/rank_<r>`.
std::string rank_directory(const checkpoint_location& where);

/// Writes one rank's state (creating directories). Each file is written atomically; `meta.json`
/// comes last so a rank directory with a `meta.json` is complete. `scheduler` may be null.
/// Throws `error{invalid_argument}` for a bad location or undefined/duplicate parameters,
/// `error{io_error}` naming the path that could not be written.
void save_rank_state(const checkpoint_location& where, const named_parameters& model,
                     const adamw& optimizer, const lr_schedule* scheduler, const rng_state& rng);

/// One rank's state as read back.
struct rank_checkpoint {
  std::map<std::string, at::Tensor> model;
  adamw_state optimizer;
  std::optional<lr_schedule> scheduler; ///< empty when saved without one
  rng_state rng;
};

/// Reads what `save_rank_state` wrote, after checking `meta.json` against `where`. Throws
/// `error{invalid_argument}` "checkpoint '<dir>' was saved with world size 2, this group has 1"
/// when the world size differs (also when this rank's directory is missing but rank 0's says
/// so), and for a rank/role/step/format mismatch; `error{not_found}` naming a missing file;
/// `error{decode_error}` naming a file that does not parse or lacks an entry.
rank_checkpoint load_rank_state(const checkpoint_location& where);

/// Copies `tensors` into the live parameters (no autograd), bit for bit. The names must match
/// exactly. Throws `error{invalid_argument}` naming a parameter missing from `tensors`, a tensor
/// no parameter takes, or a shape/dtype mismatch; nothing is copied unless all match.
void load_parameters(const named_parameters& params,
                     const std::map<std::string, at::Tensor>& tensors);

/// Everything at once for one rank: `load_rank_state`, then `load_parameters` into `model`,
/// `optimizer.load_state`, the schedule into `*scheduler` (when non-null; the checkpoint must
/// hold one) and `restore_rng_state` (torch's default CPU generator is process-wide: ranks
/// sharing a process restore it once). Returns the RNG state so the caller can restore its own
/// engines with `restore_engine`. Errors name the rank directory.
rng_state restore_rank_state(const checkpoint_location& where, const named_parameters& model,
                             adamw& optimizer, lr_schedule* scheduler);

/// Writes `root/global_step_N/trainer_state.json` (`state` must be a JSON object; the fields
/// "global_step" and "format_version" are added), then `root/latest_global_step.txt` = "N",
/// atomically (temp file, fsync, rename). Call once, after every rank of every role has saved.
/// Throws `error{not_found}` when `root/global_step_N` does not exist, `error{invalid_argument}`
/// for a non-object state or negative step, `error{io_error}` naming the path on write failure.
void finalize_checkpoint(const std::string& root, int64_t global_step, const nlohmann::json& state);

/// Reads `root/global_step_N/trainer_state.json`. Throws `error{not_found}` / `error{decode_error}`
/// naming the path (also for a missing/other format_version or a global_step mismatch).
nlohmann::json read_trainer_state(const std::string& root, int64_t global_step);

/// The step in `root/latest_global_step.txt`, or nullopt when there is no such file (nothing
/// committed yet). Throws `error{decode_error}` naming the file when it is not a non-negative
/// integer, `error{not_found}` naming the step directory when that is missing.
std::optional<int64_t> latest_step(const std::string& root);

} // namespace rlforge::backends
