#include "placement/table.hpp"

#include <algorithm>

namespace rlforge::placement {

const char* to_string(group_state x) noexcept {
  switch (x) {
  case group_state::placed:
    return "placed";
  case group_state::pending:
    return "pending";
  }
  return "unknown";
}

namespace {

placement_error unknown_group_error(std::string_view group_id) {
  return make_error(placement_errc::unknown_group,
                    "group " + std::string(group_id) + " is neither placed nor pending");
}

} // namespace

placement_table::group_entry* placement_table::find(std::string_view group_id) {
  auto i = groups_.find(std::string(group_id));
  return i == groups_.end() ? nullptr : &i->second;
}

const placement_table::group_entry* placement_table::find(std::string_view group_id) const {
  auto i = groups_.find(std::string(group_id));
  return i == groups_.end() ? nullptr : &i->second;
}

std::vector<std::string> placement_table::place_pending() {
  std::vector<std::string> placed_now;
  if (pending_.empty())
    return placed_now;
  std::vector<std::string> still;
  still.reserve(pending_.size());
  for (auto& id : pending_) {
    auto& entry = groups_.at(id);
    auto decision = detail::schedule_quiet(cluster_, entry.request);
    if (decision.placed() && cluster_.reserve(id, std::move(decision.bundles))) {
      entry.state = group_state::placed;
      placed_now.push_back(std::move(id));
    } else {
      still.push_back(std::move(id));
    }
  }
  pending_ = std::move(still);
  return placed_now;
}

result<std::vector<std::string>> placement_table::add_node(const node_spec& node) {
  if (auto ok = cluster_.add_node(node); !ok)
    return ok.error();
  return place_pending();
}

result<node_removal> placement_table::remove_node(std::string_view node_id,
                                                  evicted_groups policy) {
  auto evicted = cluster_.remove_node(node_id);
  if (!evicted)
    return evicted.error();
  node_removal out;
  out.evicted = std::move(*evicted);
  if (policy == evicted_groups::drop) {
    for (const auto& id : out.evicted)
      groups_.erase(id);
    out.placed = place_pending();
    return out;
  }
  for (const auto& id : out.evicted) {
    auto& entry = groups_.at(id);
    entry.state = group_state::pending;
    entry.allocator.reset();
  }
  pending_.insert(pending_.begin(), out.evicted.begin(), out.evicted.end());
  out.placed = place_pending();
  return out;
}

schedule_result placement_table::create(const std::string& group_id, placement_request request) {
  schedule_result out;
  if (group_id.empty()) {
    out.error = placement_errc::invalid_group_id;
    out.reason = "group id is empty";
    return out;
  }
  if (groups_.find(group_id) != groups_.end()) {
    out.error = placement_errc::duplicate_group;
    out.reason = "group " + group_id + " already exists (" + to_string(groups_.at(group_id).state) +
                 "); remove it first or pick another id";
    return out;
  }
  out = schedule(cluster_, request);
  switch (out.kind) {
  case schedule_kind::placed: {
    if (auto ok = cluster_.reserve(group_id, out.bundles); !ok) {
      schedule_result failed;
      failed.error = ok.error().code;
      failed.reason = ok.error().message;
      return failed;
    }
    groups_.emplace(group_id, group_entry{std::move(request), group_state::placed, {}});
    break;
  }
  case schedule_kind::pending:
    groups_.emplace(group_id, group_entry{std::move(request), group_state::pending, {}});
    pending_.push_back(group_id);
    break;
  case schedule_kind::infeasible:
  case schedule_kind::invalid:
    break;
  }
  return out;
}

result<std::vector<std::string>> placement_table::remove(std::string_view group_id) {
  auto i = groups_.find(std::string(group_id));
  if (i == groups_.end())
    return unknown_group_error(group_id);
  if (i->second.state == group_state::pending) {
    pending_.erase(std::find(pending_.begin(), pending_.end(), i->first));
    groups_.erase(i);
    return std::vector<std::string>{};
  }
  cluster_.release(group_id);
  groups_.erase(i);
  return place_pending();
}

result<void> placement_table::cancel_pending(std::string_view group_id) {
  auto i = groups_.find(std::string(group_id));
  if (i == groups_.end())
    return unknown_group_error(group_id);
  if (i->second.state != group_state::pending)
    return make_error(placement_errc::not_pending,
                      "group " + std::string(group_id) +
                          " is placed, not pending; remove it instead");
  pending_.erase(std::find(pending_.begin(), pending_.end(), i->first));
  groups_.erase(i);
  return {};
}

std::optional<group_state> placement_table::state(std::string_view group_id) const {
  if (const auto* entry = find(group_id))
    return entry->state;
  return std::nullopt;
}

result<std::vector<placed_bundle>> placement_table::bundles(std::string_view group_id) const {
  const auto* entry = find(group_id);
  if (entry == nullptr)
    return unknown_group_error(group_id);
  if (entry->state != group_state::placed)
    return make_error(placement_errc::not_placed,
                      "group " + std::string(group_id) + " is pending, not placed");
  return *cluster_.find_group(group_id);
}

result<std::string> placement_table::pending_reason(std::string_view group_id) const {
  const auto* entry = find(group_id);
  if (entry == nullptr)
    return unknown_group_error(group_id);
  if (entry->state != group_state::pending)
    return make_error(placement_errc::not_pending,
                      "group " + std::string(group_id) + " is placed, not pending");
  auto decision = schedule(cluster_, entry->request);
  if (decision.placed())
    return std::string("it fits now and will be placed when pending groups are retried");
  if (decision.infeasible())
    return "infeasible now: " + decision.reason;
  return decision.reason;
}

result<placement_request> placement_table::request(std::string_view group_id) const {
  const auto* entry = find(group_id);
  if (entry == nullptr)
    return unknown_group_error(group_id);
  return entry->request;
}

result<placement_table::group_entry*> placement_table::placed_entry(std::string_view group_id) {
  auto* entry = find(group_id);
  if (entry == nullptr)
    return unknown_group_error(group_id);
  if (entry->state != group_state::placed)
    return make_error(placement_errc::not_placed,
                      "group " + std::string(group_id) + " is pending, not placed");
  if (!entry->allocator) {
    auto made = bundle_allocator::make(*cluster_.find_group(group_id));
    if (!made)
      return made.error();
    entry->allocator = std::move(*made);
  }
  return entry;
}

result<actor_reservation> placement_table::reserve_in_bundle(std::string_view group_id,
                                                             std::size_t bundle_index,
                                                             const resource_set& request) {
  auto entry = placed_entry(group_id);
  if (!entry)
    return entry.error();
  auto r = (*entry)->allocator->reserve(bundle_index, request);
  if (!r)
    return make_error(r.error().code, "group " + std::string(group_id) + ": " + r.error().message);
  return r;
}

result<void> placement_table::release_in_bundle(std::string_view group_id,
                                                std::uint64_t reservation_id) {
  auto entry = placed_entry(group_id);
  if (!entry)
    return entry.error();
  auto ok = (*entry)->allocator->release(reservation_id);
  if (!ok)
    return make_error(ok.error().code,
                      "group " + std::string(group_id) + ": " + ok.error().message);
  return ok;
}

result<const bundle_allocator*> placement_table::allocator(std::string_view group_id) {
  auto entry = placed_entry(group_id);
  if (!entry)
    return entry.error();
  return static_cast<const bundle_allocator*>(&*(*entry)->allocator);
}

std::string placement_table::describe() const {
  auto out = cluster_.describe();
  for (const auto& [id, bundles] : cluster_.groups()) {
    const auto& entry = groups_.at(id);
    out += "group " + id + ": placed (" + to_string(entry.request.strategy) + ")";
    for (std::size_t rank = 0; rank < bundles.size(); ++rank) {
      const auto& b = bundles[rank];
      out += rank == 0 ? " " : ", ";
      out += "[" + std::to_string(b.request_index) + "] " + b.node_id;
      if (!b.device_ids.empty()) {
        out += " gpu ";
        for (std::size_t d = 0; d < b.device_ids.size(); ++d)
          out += (d == 0 ? "" : "+") + std::to_string(b.device_ids[d]);
      }
    }
    out += '\n';
  }
  for (const auto& id : pending_) {
    const auto& entry = groups_.at(id);
    out += "group " + id + ": pending (" + to_string(entry.request.strategy) + ", " +
           std::to_string(entry.request.bundles.size()) + " bundles)\n";
  }
  return out;
}

} // namespace rlforge::placement
