#include "placement/bundle_allocator.hpp"

#include "placement/devices.hpp"

namespace rlforge::placement {

result<bundle_allocator> bundle_allocator::make(const std::vector<placed_bundle>& bundles) {
  bundle_allocator out;
  out.slots_.resize(bundles.size());
  std::vector<bool> seen(bundles.size(), false);
  for (const auto& b : bundles) {
    if (b.request_index >= bundles.size() || seen[b.request_index])
      return make_error(placement_errc::invalid_reservation,
                        "bundle index " + std::to_string(b.request_index) +
                            " is out of range or repeated in a group of " +
                            std::to_string(bundles.size()) + " bundles");
    auto gpu = b.resources.get(gpu_resource);
    std::size_t want = gpu == 0                ? 0
                       : gpu < units_per_whole ? 1
                                               : static_cast<std::size_t>(gpu / units_per_whole);
    if (b.device_ids.size() != want)
      return make_error(placement_errc::invalid_reservation,
                        "bundle " + std::to_string(b.request_index) +
                            " holds GPU: " + format_units(gpu) + " but lists " +
                            std::to_string(b.device_ids.size()) + " devices");
    seen[b.request_index] = true;
    auto& s = out.slots_[b.request_index];
    s.bundle = b;
    s.free = b.resources;
    s.device_free.assign(b.device_ids.size(), per_device_share(b));
  }
  return out;
}

result<void> bundle_allocator::check_index(std::size_t bundle_index) const {
  if (bundle_index >= slots_.size())
    return make_error(placement_errc::index_out_of_range,
                      "bundle index " + std::to_string(bundle_index) +
                          " is out of range: the group has " + std::to_string(slots_.size()) +
                          " bundles");
  return {};
}

result<actor_reservation> bundle_allocator::reserve(std::size_t bundle_index,
                                                    const resource_set& request) {
  if (auto ok = check_index(bundle_index); !ok)
    return ok.error();
  auto& s = slots_[bundle_index];
  auto where = " in bundle " + std::to_string(bundle_index);
  for (const auto& [name, amount] : request) {
    if (amount <= 0)
      return make_error(placement_errc::invalid_amount, "cannot reserve " + name + ": " +
                                                            format_units(amount) + where +
                                                            "; amounts must be positive");
    auto left = s.free.get(name);
    if (amount > left)
      return make_error(placement_errc::insufficient_resources,
                        "cannot reserve " + name + ": " + format_units(amount) + where + ": only " +
                            name + ": " + format_units(left) + " of its " + name + ": " +
                            format_units(s.bundle.resources.get(name)) + " is left (" +
                            std::to_string(s.holders) + " reservations hold the rest)");
  }
  auto gpu = request.get(gpu_resource);
  if (gpu > units_per_whole && gpu % units_per_whole != 0)
    return make_error(placement_errc::invalid_amount,
                      "cannot reserve GPU: " + format_units(gpu) + where +
                          "; a GPU share above 1 must be a whole number of devices");
  auto devices = s.device_free;
  std::vector<int> picked;
  if (!detail::take_gpu(devices, gpu, &picked)) {
    std::string free_text;
    for (std::size_t i = 0; i < s.device_free.size(); ++i)
      free_text += (i == 0 ? "" : ", ") + std::string("device ") +
                   std::to_string(s.bundle.device_ids[i]) + ": " + format_units(s.device_free[i]);
    return make_error(placement_errc::insufficient_resources,
                      "cannot reserve GPU: " + format_units(gpu) + where + ": no device of the " +
                          "bundle has room for it (free " + free_text + ")");
  }
  s.device_free = std::move(devices);
  s.free.subtract(request);
  ++s.holders;
  actor_reservation r;
  r.id = next_id_++;
  r.bundle_index = bundle_index;
  r.node_id = s.bundle.node_id;
  for (auto local : picked)
    r.device_ids.push_back(s.bundle.device_ids[static_cast<std::size_t>(local)]);
  r.resources = request;
  reservations_.emplace(r.id, r);
  return r;
}

result<actor_reservation> bundle_allocator::reserve_gpu(std::size_t bundle_index, double fraction) {
  resource_set request;
  if (auto ok = request.set(gpu_resource, fraction); !ok)
    return ok.error();
  return reserve(bundle_index, request);
}

result<void> bundle_allocator::release(std::uint64_t reservation_id) {
  auto i = reservations_.find(reservation_id);
  if (i == reservations_.end())
    return make_error(placement_errc::unknown_reservation,
                      "reservation " + std::to_string(reservation_id) + " is not held");
  auto& s = slots_[i->second.bundle_index];
  auto gpu = i->second.resources.get(gpu_resource);
  auto per_device =
      i->second.device_ids.empty() ? 0 : gpu / static_cast<units>(i->second.device_ids.size());
  for (auto device : i->second.device_ids)
    for (std::size_t k = 0; k < s.bundle.device_ids.size(); ++k)
      if (s.bundle.device_ids[k] == device)
        s.device_free[k] += per_device;
  s.free.add(i->second.resources);
  --s.holders;
  reservations_.erase(i);
  return {};
}

result<resource_set> bundle_allocator::available(std::size_t bundle_index) const {
  if (auto ok = check_index(bundle_index); !ok)
    return ok.error();
  return slots_[bundle_index].free;
}

result<std::vector<units>> bundle_allocator::device_available(std::size_t bundle_index) const {
  if (auto ok = check_index(bundle_index); !ok)
    return ok.error();
  return slots_[bundle_index].device_free;
}

const actor_reservation* bundle_allocator::find(std::uint64_t reservation_id) const {
  auto i = reservations_.find(reservation_id);
  return i == reservations_.end() ? nullptr : &i->second;
}

} // namespace rlforge::placement
