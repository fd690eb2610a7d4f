#pragma once

#include <c10/core/Device.h>

#include "runtime/messages.hpp"

namespace rlforge::actors {

/// The device a rank computes on: `cuda:device_ids[0]` when its bundle's GPU is a real one
/// that this process sees (`rank_info::virtual_gpu` false, set by the rank when it starts,
/// backends/devices.hpp `rank_device`), else the CPU (virtual GPUs).
inline c10::Device compute_device(const rank_info& info) {
  if (info.virtual_gpu || info.device_ids.empty())
    return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(info.device_ids.front()));
}

} // namespace rlforge::actors
