#pragma once

#include <cstddef>
#include <vector>

#include "placement/resources.hpp"

/// Device-picking rules shared by the scheduler (devices of a node) and the bundle allocator
/// (devices of a bundle). Internal to the placement library.
namespace rlforge::placement::detail {

/// Counts devices that are entirely free (free == one whole GPU).
inline std::size_t count_whole_free(const std::vector<units>& free) noexcept {
  std::size_t n = 0;
  for (auto f : free)
    n += f == units_per_whole ? 1 : 0;
  return n;
}

/// For a fractional GPU amount (< 1): the device whose free share is the smallest that still
/// holds `amount` (the most-used device that fits, which keeps whole devices free for whole-GPU
/// bundles); the lowest id on ties. Returns -1 when no device fits.
inline int pick_fractional_device(const std::vector<units>& free, units amount) noexcept {
  int best = -1;
  for (std::size_t i = 0; i < free.size(); ++i)
    if (free[i] >= amount && (best < 0 || free[i] < free[static_cast<std::size_t>(best)]))
      best = static_cast<int>(i);
  return best;
}

/// True when `gpu` units can be taken from `free`: `gpu / 10000` entirely free devices when
/// gpu >= 1, one device with enough free share when 0 < gpu < 1, always when gpu == 0.
inline bool gpu_fits(const std::vector<units>& free, units gpu) noexcept {
  if (gpu == 0)
    return true;
  if (gpu >= units_per_whole)
    return count_whole_free(free) >= static_cast<std::size_t>(gpu / units_per_whole);
  return pick_fractional_device(free, gpu) >= 0;
}

/// Takes `gpu` units from `free` following `gpu_fits`; whole devices are taken lowest id first.
/// Appends the chosen device ids (ascending) to `out` when it is not null. Returns false and
/// changes nothing when the amount does not fit.
inline bool take_gpu(std::vector<units>& free, units gpu, std::vector<int>* out) {
  if (gpu == 0)
    return true;
  if (gpu >= units_per_whole) {
    auto need = static_cast<std::size_t>(gpu / units_per_whole);
    if (count_whole_free(free) < need)
      return false;
    for (std::size_t i = 0; i < free.size() && need > 0; ++i) {
      if (free[i] == units_per_whole) {
        free[i] = 0;
        --need;
        if (out != nullptr)
          out->push_back(static_cast<int>(i));
      }
    }
    return true;
  }
  auto device = pick_fractional_device(free, gpu);
  if (device < 0)
    return false;
  free[static_cast<std::size_t>(device)] -= gpu;
  if (out != nullptr)
    out->push_back(device);
  return true;
}

} // namespace rlforge::placement::detail
