#include "placement/cluster.hpp"

#include <algorithm>

#include "placement/devices.hpp"

namespace rlforge::placement {

namespace {

constexpr std::size_t gpu_column = 0;
constexpr std::size_t max_devices = 4096;

std::string list_units(const std::vector<units>& xs) {
  std::string out;
  for (auto x : xs) {
    if (!out.empty())
      out += ", ";
    out += format_units(x);
  }
  return "[" + out + "]";
}

} // namespace

result<node_spec> make_node(std::string id, int gpus, double cpus, resource_set extra) {
  if (id.empty())
    return make_error(placement_errc::invalid_node, "node id is empty");
  if (gpus < 0)
    return make_error(placement_errc::invalid_node, "node " + id + " declares " +
                                                        std::to_string(gpus) +
                                                        " GPUs; the count must not be negative");
  if (extra.contains(gpu_resource) || extra.contains(cpu_resource))
    return make_error(placement_errc::invalid_node,
                      "node " + id + ": extra resources (" + extra.to_string() +
                          ") must not name GPU or CPU; use the gpus and cpus arguments");
  node_spec out;
  out.id = std::move(id);
  out.resources = std::move(extra);
  if (cpus != 0) {
    if (auto ok = out.resources.set(cpu_resource, cpus); !ok)
      return make_error(ok.error().code, "node " + out.id + ": " + ok.error().message);
  }
  if (gpus > 0) {
    out.gpu_devices.assign(static_cast<std::size_t>(gpus), units_per_whole);
    if (auto ok = out.resources.set_units(gpu_resource, units_per_whole * gpus); !ok)
      return ok.error();
  }
  return out;
}

cluster_state::cluster_state() : columns_{std::string(gpu_resource), std::string(cpu_resource)} {}

int cluster_state::column(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < columns_.size(); ++i)
    if (columns_[i] == name)
      return static_cast<int>(i);
  return -1;
}

std::size_t cluster_state::ensure_column(std::string_view name) {
  if (auto c = column(name); c >= 0)
    return static_cast<std::size_t>(c);
  columns_.emplace_back(name);
  for (auto& n : nodes_) {
    n.total.columns.push_back(0);
    n.free.columns.push_back(0);
  }
  return columns_.size() - 1;
}

std::optional<std::size_t> cluster_state::node_index(std::string_view node_id) const {
  auto i = node_index_.find(std::string(node_id));
  if (i == node_index_.end())
    return std::nullopt;
  return i->second;
}

bool cluster_state::has_node(std::string_view node_id) const {
  return node_index(node_id).has_value();
}

result<void> cluster_state::add_node(const node_spec& node) {
  if (node.id.empty())
    return make_error(placement_errc::invalid_node, "node id is empty");
  if (has_node(node.id))
    return make_error(placement_errc::duplicate_node,
                      "node " + node.id + " is already in the cluster");
  if (node.gpu_devices.size() > max_devices)
    return make_error(placement_errc::invalid_node, "node " + node.id + " declares " +
                                                        std::to_string(node.gpu_devices.size()) +
                                                        " GPU devices; at most 4096 are supported");
  units device_sum = 0;
  for (std::size_t i = 0; i < node.gpu_devices.size(); ++i) {
    auto cap = node.gpu_devices[i];
    if (cap <= 0 || cap > units_per_whole)
      return make_error(placement_errc::invalid_node,
                        "node " + node.id + ": GPU device " + std::to_string(i) + " has capacity " +
                            format_units(cap) + "; a device holds more than 0 and at most 1 GPU");
    device_sum += cap;
  }
  for (const auto& [name, amount] : node.resources) {
    if (name.empty())
      return make_error(placement_errc::invalid_node,
                        "node " + node.id + " declares a resource with an empty name");
    if (amount <= 0)
      return make_error(placement_errc::invalid_node, "node " + node.id + " declares " + name +
                                                          ": " + format_units(amount) +
                                                          "; amounts must be positive");
  }
  std::vector<units> devices = node.gpu_devices;
  auto declared_gpu = node.resources.get(gpu_resource);
  if (devices.empty() && declared_gpu > 0) {
    if (declared_gpu % units_per_whole != 0)
      return make_error(placement_errc::invalid_node,
                        "node " + node.id + " declares GPU: " + format_units(declared_gpu) +
                            " without devices; list gpu_devices for fractional devices");
    if (declared_gpu / units_per_whole > static_cast<units>(max_devices))
      return make_error(placement_errc::invalid_node,
                        "node " + node.id + " declares GPU: " + format_units(declared_gpu) +
                            "; at most 4096 devices are supported");
    devices.assign(static_cast<std::size_t>(declared_gpu / units_per_whole), units_per_whole);
    device_sum = declared_gpu;
  } else if (!devices.empty() && declared_gpu > 0 && declared_gpu != device_sum) {
    return make_error(placement_errc::invalid_node,
                      "node " + node.id + " declares GPU: " + format_units(declared_gpu) +
                          " but its devices " + list_units(devices) + " sum to " +
                          format_units(device_sum));
  }
  detail::node_entry entry;
  entry.id = node.id;
  for (const auto& [name, amount] : node.resources)
    if (name != gpu_resource)
      ensure_column(name);
  entry.total.columns.assign(columns_.size(), 0);
  for (const auto& [name, amount] : node.resources)
    if (name != gpu_resource)
      entry.total.columns[static_cast<std::size_t>(column(name))] = amount;
  entry.total.columns[gpu_column] = device_sum;
  entry.total.devices = std::move(devices);
  entry.free = entry.total;
  node_index_.emplace(node.id, nodes_.size());
  nodes_.push_back(std::move(entry));
  return {};
}

result<std::vector<std::string>> cluster_state::remove_node(std::string_view node_id) {
  auto index = node_index(node_id);
  if (!index)
    return make_error(placement_errc::unknown_node,
                      "node " + std::string(node_id) + " is not in the cluster");
  std::vector<std::string> evicted;
  for (const auto& [group, bundles] : groups_)
    for (const auto& b : bundles)
      if (b.node_id == node_id) {
        evicted.push_back(group);
        break;
      }
  for (const auto& group : evicted)
    release(group);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(*index));
  node_index_.clear();
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    node_index_.emplace(nodes_[i].id, i);
  return evicted;
}

result<void> cluster_state::take(const placed_bundle& bundle) {
  auto where = "bundle " + std::to_string(bundle.request_index);
  if (auto ok = validate_bundle(bundle.resources, bundle.request_index); !ok)
    return ok;
  auto index = node_index(bundle.node_id);
  if (!index)
    return make_error(placement_errc::unknown_node,
                      where + " names node " + bundle.node_id + ", which is not in the cluster");
  auto& node = nodes_[*index];
  auto gpu = bundle.resources.get(gpu_resource);
  std::size_t want_devices = gpu == 0 ? 0
                             : gpu < units_per_whole
                                 ? 1
                                 : static_cast<std::size_t>(gpu / units_per_whole);
  if (bundle.device_ids.size() != want_devices)
    return make_error(placement_errc::invalid_reservation,
                      where + " holds GPU: " + format_units(gpu) + " but lists " +
                          std::to_string(bundle.device_ids.size()) + " devices; expected " +
                          std::to_string(want_devices));
  for (std::size_t i = 0; i < bundle.device_ids.size(); ++i) {
    auto d = bundle.device_ids[i];
    if (d < 0 || static_cast<std::size_t>(d) >= node.free.devices.size())
      return make_error(placement_errc::invalid_reservation,
                        where + " names device " + std::to_string(d) + " but node " + node.id +
                            " has " + std::to_string(node.free.devices.size()) + " devices");
    for (std::size_t j = 0; j < i; ++j)
      if (bundle.device_ids[j] == d)
        return make_error(placement_errc::invalid_reservation,
                          where + " lists device " + std::to_string(d) + " twice");
  }
  auto share = per_device_share(bundle);
  for (auto d : bundle.device_ids)
    if (node.free.devices[static_cast<std::size_t>(d)] < share)
      return make_error(placement_errc::insufficient_resources,
                        where + " needs GPU: " + format_units(share) + " of device " +
                            std::to_string(d) + " on node " + node.id + " but only " +
                            format_units(node.free.devices[static_cast<std::size_t>(d)]) +
                            " is free");
  for (const auto& [name, amount] : bundle.resources) {
    if (name == gpu_resource)
      continue;
    auto c = column(name);
    auto have = c < 0 ? 0 : node.free.columns[static_cast<std::size_t>(c)];
    if (have < amount)
      return make_error(placement_errc::insufficient_resources,
                        where + " needs " + name + ": " + format_units(amount) + " on node " +
                            node.id + " but only " + format_units(have) + " is free");
  }
  for (auto d : bundle.device_ids)
    node.free.devices[static_cast<std::size_t>(d)] -= share;
  node.free.columns[gpu_column] -= gpu;
  for (const auto& [name, amount] : bundle.resources)
    if (name != gpu_resource)
      node.free.columns[static_cast<std::size_t>(column(name))] -= amount;
  return {};
}

void cluster_state::give(const placed_bundle& bundle) {
  auto index = node_index(bundle.node_id);
  if (!index)
    return;
  auto& node = nodes_[*index];
  auto share = per_device_share(bundle);
  for (auto d : bundle.device_ids)
    node.free.devices[static_cast<std::size_t>(d)] += share;
  for (const auto& [name, amount] : bundle.resources) {
    if (name == gpu_resource)
      node.free.columns[gpu_column] += amount;
    else
      node.free.columns[static_cast<std::size_t>(column(name))] += amount;
  }
}

result<void> cluster_state::reserve(const std::string& group_id,
                                    std::vector<placed_bundle> bundles) {
  if (group_id.empty())
    return make_error(placement_errc::invalid_group_id, "group id is empty");
  if (groups_.find(group_id) != groups_.end())
    return make_error(placement_errc::duplicate_group,
                      "group " + group_id + " already holds reservations");
  if (bundles.empty())
    return make_error(placement_errc::empty_request,
                      "group " + group_id + ": nothing to reserve (no bundles)");
  for (std::size_t applied = 0; applied < bundles.size(); ++applied) {
    if (auto ok = take(bundles[applied]); !ok) {
      for (std::size_t j = 0; j < applied; ++j)
        give(bundles[j]);
      return make_error(ok.error().code, "group " + group_id + ": " + ok.error().message);
    }
  }
  groups_.emplace(group_id, std::move(bundles));
  return {};
}

result<std::vector<placed_bundle>> cluster_state::release(std::string_view group_id) {
  auto i = groups_.find(group_id);
  if (i == groups_.end())
    return make_error(placement_errc::unknown_group,
                      "group " + std::string(group_id) + " holds no reservations");
  for (const auto& b : i->second)
    give(b);
  auto out = std::move(i->second);
  groups_.erase(i);
  return out;
}

const std::vector<placed_bundle>* cluster_state::find_group(std::string_view group_id) const {
  auto i = groups_.find(group_id);
  return i == groups_.end() ? nullptr : &i->second;
}

resource_set cluster_state::to_resources(const std::vector<units>& columns) const {
  resource_set out;
  for (std::size_t c = 0; c < columns.size(); ++c)
    if (columns[c] > 0)
      out.set_units(columns_[c], columns[c]);
  return out;
}

result<node_status> cluster_state::node(std::string_view node_id) const {
  auto index = node_index(node_id);
  if (!index)
    return make_error(placement_errc::unknown_node,
                      "node " + std::string(node_id) + " is not in the cluster");
  const auto& n = nodes_[*index];
  return node_status{n.id, to_resources(n.total.columns), to_resources(n.free.columns),
                     n.total.devices, n.free.devices};
}

std::vector<node_status> cluster_state::nodes() const {
  std::vector<node_status> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_)
    out.push_back(node_status{n.id, to_resources(n.total.columns), to_resources(n.free.columns),
                              n.total.devices, n.free.devices});
  return out;
}

std::vector<std::string> cluster_state::group_ids() const {
  std::vector<std::string> out;
  out.reserve(groups_.size());
  for (const auto& entry : groups_)
    out.push_back(entry.first);
  return out;
}

std::string cluster_state::describe() const {
  // Who holds each device: "g2[1] 0.2" per bundle sharing it.
  std::vector<std::vector<std::vector<std::string>>> holders(nodes_.size());
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    holders[i].resize(nodes_[i].total.devices.size());
  for (const auto& [group, bundles] : groups_)
    for (const auto& b : bundles) {
      auto index = node_index(b.node_id);
      if (!index)
        continue;
      auto share = per_device_share(b);
      for (auto d : b.device_ids)
        holders[*index][static_cast<std::size_t>(d)].push_back(
            group + "[" + std::to_string(b.request_index) + "] " + format_units(share));
    }
  std::string out;
  if (nodes_.empty())
    out += "no nodes\n";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    out += "node " + n.id + ":";
    bool first = true;
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      if (n.total.columns[c] == 0)
        continue;
      out += first ? " " : ", ";
      first = false;
      out += columns_[c] + " " + format_units(n.total.columns[c] - n.free.columns[c]) + "/" +
             format_units(n.total.columns[c]) + " used";
    }
    if (first)
      out += " no resources";
    out += '\n';
    for (std::size_t d = 0; d < n.total.devices.size(); ++d) {
      out += "  gpu " + std::to_string(d) + ": " +
             format_units(n.total.devices[d] - n.free.devices[d]) + "/" +
             format_units(n.total.devices[d]);
      if (holders[i][d].empty()) {
        out += " free";
      } else {
        out += " used by ";
        for (std::size_t h = 0; h < holders[i][d].size(); ++h)
          out += (h == 0 ? "" : ", ") + holders[i][d][h];
      }
      out += '\n';
    }
  }
  return out;
}

} // namespace rlforge::placement
