#include "placement/scheduler.hpp"

#include <algorithm>
#include <climits>
#include <numeric>
#include <utility>

#include "placement/devices.hpp"

namespace rlforge::placement {

const char* to_string(schedule_kind x) noexcept {
  switch (x) {
  case schedule_kind::placed:
    return "placed";
  case schedule_kind::pending:
    return "pending";
  case schedule_kind::infeasible:
    return "infeasible";
  case schedule_kind::invalid:
    return "invalid";
  }
  return "unknown";
}

namespace {

using detail::node_amounts;
using detail::node_entry;

constexpr std::size_t gpu_column = 0;
constexpr std::size_t cpu_column = 1;
constexpr std::size_t max_listed_nodes = 8;
constexpr std::size_t max_listed_groups = 6;

/// One bundle in dense form: its non-GPU amounts live in `compiled_request::flat`.
struct need {
  std::size_t index = 0;
  units gpu = 0;
  units cpu = 0;
  std::size_t first = 0;
  std::size_t last = 0;
  bool unknown = false; ///< names a resource no node declares: fits nowhere
};

struct compiled_request {
  std::vector<need> needs; ///< in placement order: larger GPU, then larger CPU, first
  std::vector<std::pair<std::size_t, units>> flat;
  std::vector<std::size_t> used_columns;
};

void mark_column(std::vector<std::size_t>& used, std::size_t c) {
  if (std::find(used.begin(), used.end(), c) == used.end())
    used.push_back(c);
}

compiled_request compile(const cluster_state& cluster, const placement_request& request) {
  compiled_request out;
  out.needs.reserve(request.bundles.size());
  for (std::size_t i = 0; i < request.bundles.size(); ++i) {
    need n;
    n.index = i;
    n.first = out.flat.size();
    for (const auto& [name, amount] : request.bundles[i]) {
      if (name == gpu_resource) {
        n.gpu = amount;
        mark_column(out.used_columns, gpu_column);
        continue;
      }
      auto c = cluster.column(name);
      if (c < 0) {
        n.unknown = true;
        continue;
      }
      auto col = static_cast<std::size_t>(c);
      out.flat.emplace_back(col, amount);
      mark_column(out.used_columns, col);
      if (col == cpu_column)
        n.cpu = amount;
    }
    n.last = out.flat.size();
    out.needs.push_back(n);
  }
  std::sort(out.needs.begin(), out.needs.end(), [](const need& a, const need& b) {
    if (a.gpu != b.gpu)
      return a.gpu > b.gpu;
    if (a.cpu != b.cpu)
      return a.cpu > b.cpu;
    return a.index < b.index;
  });
  return out;
}

struct assignment {
  int node = -1;
  std::vector<int> devices; ///< ascending: `take_gpu` appends in id order
};

/// Plans one request over either the free amounts of the nodes or (`totals`) their capacity,
/// i.e. the same nodes with nothing reserved. Tentative placements go to copies of the touched
/// nodes only, so a plan costs O(nodes x bundles) reads and O(bundles) node copies.
class planner {
public:
  planner(const cluster_state& cluster, const compiled_request& request, bool totals)
      : nodes_(cluster.entries()), req_(request), totals_(totals), out_(request.needs.size()) {
    touched_.reserve(request.needs.size());
  }

  bool run(placement_strategy strategy) {
    switch (strategy) {
    case placement_strategy::pack:
      return pack();
    case placement_strategy::spread:
      return spread(false);
    case placement_strategy::strict_pack:
      return strict_pack();
    case placement_strategy::strict_spread:
      return spread(true);
    }
    return false;
  }

  const std::vector<assignment>& assignments() const noexcept { return out_; }

  /// Position (in `needs`) of the bundle that could not be placed; npos for strict_pack.
  std::size_t failed() const noexcept { return failed_; }

  /// Bundles given distinct nodes by the spread matching.
  std::size_t matched() const noexcept { return matched_; }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

private:
  const node_amounts& base(std::size_t n) const {
    return totals_ ? nodes_[n].total : nodes_[n].free;
  }

  const node_amounts& current(std::size_t n) const {
    for (const auto& t : touched_)
      if (t.first == n)
        return t.second;
    return base(n);
  }

  node_amounts& mutable_node(std::size_t n) {
    for (auto& t : touched_)
      if (t.first == n)
        return t.second;
    touched_.emplace_back(n, base(n));
    return touched_.back().second;
  }

  bool fits(const node_amounts& a, const need& b) const {
    if (b.unknown)
      return false;
    for (std::size_t k = b.first; k < b.last; ++k)
      if (a.columns[req_.flat[k].first] < req_.flat[k].second)
        return false;
    return detail::gpu_fits(a.devices, b.gpu);
  }

  bool take(node_amounts& a, const need& b, std::vector<int>* devices) const {
    if (!fits(a, b))
      return false;
    for (std::size_t k = b.first; k < b.last; ++k)
      a.columns[req_.flat[k].first] -= req_.flat[k].second;
    detail::take_gpu(a.devices, b.gpu, devices);
    a.columns[gpu_column] -= b.gpu;
    return true;
  }

  /// The largest used fraction, over the resources the request names, of node n.
  double load(std::size_t n) const {
    const auto& a = current(n);
    const auto& t = nodes_[n].total;
    double l = 0;
    for (auto c : req_.used_columns)
      if (t.columns[c] > 0)
        l = std::max(l, static_cast<double>(t.columns[c] - a.columns[c]) /
                            static_cast<double>(t.columns[c]));
    return l;
  }

  void place(std::size_t pos, std::size_t n) {
    auto& m = mutable_node(n);
    take(m, req_.needs[pos], &out_[pos].devices);
    out_[pos].node = static_cast<int>(n);
  }

  bool pack() {
    std::vector<std::size_t> remaining(req_.needs.size());
    std::iota(remaining.begin(), remaining.end(), std::size_t{0});
    std::vector<std::size_t> keep;
    while (!remaining.empty()) {
      int best = -1;
      std::size_t best_count = 0;
      double best_load = -1;
      for (std::size_t n = 0; n < nodes_.size(); ++n) {
        auto l = load(n);
        // Once some node holds every remaining bundle, only a more loaded one can win.
        if (best_count == remaining.size() && l <= best_load)
          continue;
        const auto& cur = current(n);
        scratch_.columns = cur.columns;
        scratch_.devices = cur.devices;
        std::size_t count = 0;
        for (auto pos : remaining)
          count += take(scratch_, req_.needs[pos], nullptr) ? 1 : 0;
        if (count == 0 || count < best_count)
          continue;
        if (count > best_count || l > best_load) {
          best = static_cast<int>(n);
          best_count = count;
          best_load = l;
        }
      }
      if (best < 0) {
        failed_ = remaining.front();
        return false;
      }
      auto& m = mutable_node(static_cast<std::size_t>(best));
      keep.clear();
      for (auto pos : remaining) {
        if (take(m, req_.needs[pos], &out_[pos].devices))
          out_[pos].node = best;
        else
          keep.push_back(pos);
      }
      remaining.swap(keep);
    }
    return true;
  }

  bool strict_pack() {
    int best = -1;
    double best_load = -1;
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      auto l = load(n);
      if (l <= best_load)
        continue; // cannot beat the node already chosen
      const auto& cur = current(n);
      scratch_.columns = cur.columns;
      scratch_.devices = cur.devices;
      bool all = true;
      for (const auto& b : req_.needs)
        if (!take(scratch_, b, nullptr)) {
          all = false;
          break;
        }
      if (!all)
        continue;
      {
        best = static_cast<int>(n);
        best_load = l;
      }
    }
    if (best < 0) {
      failed_ = npos;
      return false;
    }
    for (std::size_t pos = 0; pos < req_.needs.size(); ++pos)
      place(pos, static_cast<std::size_t>(best));
    return true;
  }

  bool fits_alone(std::size_t pos, std::size_t n) {
    auto& memo = fit_memo_[pos * nodes_.size() + n];
    if (memo < 0)
      memo = fits(base(n), req_.needs[pos]) ? 1 : 0;
    return memo == 1;
  }

  // Kuhn's augmenting path: bundles on distinct nodes, nodes tried least loaded first.
  bool augment(std::size_t pos) {
    for (auto n : preference_) {
      if (visited_[n] != 0 || !fits_alone(pos, n))
        continue;
      visited_[n] = 1;
      if (owner_[n] < 0 || augment(static_cast<std::size_t>(owner_[n]))) {
        owner_[n] = static_cast<int>(pos);
        out_[pos].node = static_cast<int>(n);
        return true;
      }
    }
    return false;
  }

  bool spread(bool strict) {
    auto node_count = nodes_.size();
    auto need_count = req_.needs.size();
    std::vector<double> loads(node_count);
    for (std::size_t n = 0; n < node_count; ++n)
      loads[n] = load(n);
    preference_.resize(node_count);
    std::iota(preference_.begin(), preference_.end(), std::size_t{0});
    std::stable_sort(preference_.begin(), preference_.end(),
                     [&](std::size_t a, std::size_t b) { return loads[a] < loads[b]; });
    fit_memo_.assign(node_count * need_count, -1);
    owner_.assign(node_count, -1);
    for (std::size_t pos = 0; pos < need_count; ++pos) {
      // An idle fitting node first: only displace earlier bundles when there is none, so
      // bundles keep their preferred nodes whenever possible.
      bool done = false;
      for (auto n : preference_)
        if (owner_[n] < 0 && fits_alone(pos, n)) {
          owner_[n] = static_cast<int>(pos);
          out_[pos].node = static_cast<int>(n);
          done = true;
          break;
        }
      if (!done) {
        visited_.assign(node_count, 0);
        augment(pos);
      }
    }
    matched_ = 0;
    failed_ = npos;
    for (std::size_t pos = 0; pos < need_count; ++pos) {
      if (out_[pos].node >= 0)
        ++matched_;
      else if (failed_ == npos)
        failed_ = pos;
    }
    if (strict && matched_ < need_count)
      return false;
    std::vector<std::size_t> per_node(node_count, 0);
    for (std::size_t pos = 0; pos < need_count; ++pos) {
      if (out_[pos].node < 0)
        continue;
      auto n = static_cast<std::size_t>(out_[pos].node);
      out_[pos].node = -1;
      place(pos, n);
      ++per_node[n];
    }
    for (std::size_t pos = 0; pos < need_count; ++pos) {
      if (out_[pos].node >= 0)
        continue;
      int best = -1;
      double best_load = 0;
      for (std::size_t n = 0; n < node_count; ++n) {
        if (!fits(current(n), req_.needs[pos]))
          continue;
        auto l = load(n);
        auto bn = static_cast<std::size_t>(best);
        if (best < 0 || per_node[n] < per_node[bn] ||
            (per_node[n] == per_node[bn] && l < best_load)) {
          best = static_cast<int>(n);
          best_load = l;
        }
      }
      if (best < 0) {
        failed_ = pos;
        return false;
      }
      place(pos, static_cast<std::size_t>(best));
      ++per_node[static_cast<std::size_t>(best)];
    }
    failed_ = npos;
    return true;
  }

  const std::vector<node_entry>& nodes_;
  const compiled_request& req_;
  bool totals_;
  std::vector<assignment> out_;
  std::vector<std::pair<std::size_t, node_amounts>> touched_;
  node_amounts scratch_;
  std::size_t failed_ = npos;
  std::size_t matched_ = 0;
  std::vector<std::size_t> preference_;
  std::vector<signed char> fit_memo_;
  std::vector<int> owner_;
  std::vector<char> visited_;
};

schedule_result invalid_result(const placement_error& error) {
  schedule_result out;
  out.kind = schedule_kind::invalid;
  out.reason = error.message;
  out.error = error.code;
  return out;
}

schedule_result placed_result(const cluster_state& cluster, const placement_request& request,
                              const compiled_request& compiled, const planner& plan) {
  const auto& nodes = cluster.entries();
  auto& assigned = plan.assignments();
  std::vector<std::size_t> order(assigned.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto first_device = [&](std::size_t pos) {
    return assigned[pos].devices.empty() ? INT_MAX : assigned[pos].devices.front();
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (assigned[a].node != assigned[b].node)
      return assigned[a].node < assigned[b].node;
    auto da = first_device(a);
    auto db = first_device(b);
    if (da != db)
      return da < db;
    return compiled.needs[a].index < compiled.needs[b].index;
  });
  schedule_result out;
  out.kind = schedule_kind::placed;
  out.bundles.reserve(order.size());
  for (auto pos : order) {
    placed_bundle b;
    b.request_index = compiled.needs[pos].index;
    b.node_id = nodes[static_cast<std::size_t>(assigned[pos].node)].id;
    b.device_ids = assigned[pos].devices;
    b.resources = request.bundles[b.request_index];
    out.bundles.push_back(std::move(b));
  }
  return out;
}

std::string bundle_label(const placement_request& request, std::size_t index) {
  return "bundle " + std::to_string(index) + " (" + request.bundles[index].to_string() + ")";
}

resource_set request_sum(const placement_request& request) {
  resource_set sum;
  for (const auto& b : request.bundles)
    sum.add(b);
  return sum;
}

units max_total(const cluster_state& cluster, std::size_t column) {
  units best = 0;
  for (const auto& n : cluster.entries())
    best = std::max(best, n.total.columns[column]);
  return best;
}

/// Why bundle `index` fits no node even with nothing reserved.
std::string explain_bundle(const cluster_state& cluster, const placement_request& request,
                           std::size_t index) {
  const auto& bundle = request.bundles[index];
  auto head = "bundle " + std::to_string(index) + " needs ";
  for (const auto& [name, amount] : bundle) {
    auto c = cluster.column(name);
    auto largest = c < 0 ? 0 : max_total(cluster, static_cast<std::size_t>(c));
    auto asked = name + ": " + format_units(amount);
    if (largest == 0)
      return head + asked + " but no node has " + name;
    if (amount > largest)
      return head + asked + " but the largest node has " + name + ": " + format_units(largest);
    if (name != gpu_resource)
      continue;
    if (amount >= units_per_whole) {
      std::size_t most = 0;
      for (const auto& n : cluster.entries())
        most = std::max(most, detail::count_whole_free(n.total.devices));
      auto want = static_cast<std::size_t>(amount / units_per_whole);
      if (most < want)
        return head + asked + " as " + std::to_string(want) +
               " whole devices but no node has more than " + std::to_string(most) +
               " whole devices";
    } else {
      units biggest = 0;
      for (const auto& n : cluster.entries())
        for (auto cap : n.total.devices)
          biggest = std::max(biggest, cap);
      if (biggest < amount)
        return head + asked +
               " on one device but the largest device has GPU: " + format_units(biggest);
    }
  }
  return head + bundle.to_string() + " on one node but no single node has all of it";
}

std::string explain_infeasible(const cluster_state& cluster, const placement_request& request,
                               const compiled_request& compiled, const planner& plan) {
  const auto& nodes = cluster.entries();
  if (nodes.empty())
    return "the cluster has no nodes; " + bundle_label(request, 0) + " cannot be placed";
  // A bundle that fits no empty node is the most useful thing to name.
  std::vector<bool> fits_somewhere(request.bundles.size(), false);
  for (const auto& b : compiled.needs) {
    if (b.unknown)
      continue;
    for (const auto& n : nodes) {
      bool ok = detail::gpu_fits(n.total.devices, b.gpu);
      for (std::size_t k = b.first; ok && k < b.last; ++k)
        ok = n.total.columns[compiled.flat[k].first] >= compiled.flat[k].second;
      if (ok) {
        fits_somewhere[b.index] = true;
        break;
      }
    }
  }
  for (std::size_t i = 0; i < request.bundles.size(); ++i)
    if (!fits_somewhere[i])
      return explain_bundle(cluster, request, i);
  auto bundles = std::to_string(request.bundles.size());
  switch (request.strategy) {
  case placement_strategy::strict_spread: {
    if (request.bundles.size() > nodes.size())
      return "strict_spread needs " + bundles + " distinct nodes (one per bundle) but the " +
             "cluster has " + std::to_string(nodes.size()) + " node" +
             (nodes.size() == 1 ? "" : "s");
    auto failed = compiled.needs[plan.failed()].index;
    return "strict_spread: at most " + std::to_string(plan.matched()) + " of the " + bundles +
           " bundles can have distinct nodes even with nothing reserved; " +
           bundle_label(request, failed) + " finds no node of its own";
  }
  case placement_strategy::strict_pack: {
    auto sum = request_sum(request);
    for (const auto& [name, amount] : sum) {
      auto c = cluster.column(name);
      auto largest = c < 0 ? 0 : max_total(cluster, static_cast<std::size_t>(c));
      if (amount > largest)
        return "strict_pack needs " + name + ": " + format_units(amount) +
               " on one node (the sum of its " + bundles + " bundles) but the largest node " +
               "has " + name + ": " + format_units(largest);
    }
    return "strict_pack needs " + sum.to_string() + " on one node but no node can hold all " +
           bundles + " bundles together";
  }
  case placement_strategy::pack:
  case placement_strategy::spread:
    break;
  }
  auto failed = compiled.needs[plan.failed()].index;
  return std::string(to_string(request.strategy)) + ": " + bundle_label(request, failed) +
         " cannot be placed even with nothing reserved; the " + bundles + " bundles need " +
         request_sum(request).to_string() + " in total";
}

/// What is held on each node, restricted to the resources the request names, and by whom.
std::string describe_holdings(const cluster_state& cluster, const compiled_request& compiled) {
  const auto& nodes = cluster.entries();
  const auto& columns = cluster.columns();
  std::vector<std::vector<std::pair<std::string, resource_set>>> held(nodes.size());
  for (const auto& [group, bundles] : cluster.groups()) {
    for (const auto& b : bundles) {
      auto index = cluster.node_index(b.node_id);
      if (!index)
        continue;
      resource_set part;
      for (auto c : compiled.used_columns)
        if (auto amount = b.resources.get(columns[c]); amount > 0)
          part.set_units(columns[c], amount);
      if (part.empty())
        continue;
      auto& list = held[*index];
      if (list.empty() || list.back().first != group)
        list.emplace_back(group, resource_set{});
      list.back().second.add(part);
    }
  }
  std::string out;
  std::size_t listed = 0;
  std::size_t unlisted = 0;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (held[n].empty())
      continue;
    if (listed == max_listed_nodes) {
      ++unlisted;
      continue;
    }
    ++listed;
    std::string free_text;
    for (auto c : compiled.used_columns) {
      if (nodes[n].total.columns[c] == 0)
        continue;
      free_text += free_text.empty() ? "" : ", ";
      free_text += columns[c] + ": " + format_units(nodes[n].free.columns[c]);
    }
    out += out.empty() ? "" : "; ";
    out += "node " + nodes[n].id + " (free " + free_text + ") by ";
    for (std::size_t g = 0; g < held[n].size() && g < max_listed_groups; ++g)
      out += (g == 0 ? "" : ", ") + held[n][g].first + " (" + held[n][g].second.to_string() + ")";
    if (held[n].size() > max_listed_groups)
      out += " and " + std::to_string(held[n].size() - max_listed_groups) + " more groups";
  }
  if (out.empty())
    return "nothing is held on the resources it needs";
  if (unlisted > 0)
    out += "; and " + std::to_string(unlisted) + " more nodes";
  return "held: " + out;
}

std::string explain_pending(const cluster_state& cluster, const placement_request& request,
                            const compiled_request& compiled, const planner& plan) {
  auto bundles = std::to_string(request.bundles.size());
  std::string head;
  switch (request.strategy) {
  case placement_strategy::strict_pack:
    head = "strict_pack: no node has room for all " + bundles + " bundles (" +
           request_sum(request).to_string() + " together) now";
    break;
  case placement_strategy::strict_spread:
    head = "strict_spread: only " + std::to_string(plan.matched()) + " of the " + bundles +
           " bundles can have distinct nodes now; " +
           bundle_label(request, compiled.needs[plan.failed()].index) + " finds no node of its own";
    break;
  case placement_strategy::pack:
  case placement_strategy::spread:
    head = std::string(to_string(request.strategy)) + ": " +
           bundle_label(request, compiled.needs[plan.failed()].index) +
           " does not fit on any node now";
    break;
  }
  return head + "; " + describe_holdings(cluster, compiled);
}

schedule_result run_schedule(const cluster_state& cluster, const placement_request& request,
                             bool explain) {
  if (auto ok = validate_request(request); !ok)
    return invalid_result(ok.error());
  auto compiled = compile(cluster, request);
  planner now(cluster, compiled, false);
  if (now.run(request.strategy))
    return placed_result(cluster, request, compiled, now);
  schedule_result out;
  out.kind = schedule_kind::pending;
  if (!explain)
    return out;
  planner empty(cluster, compiled, true);
  if (!empty.run(request.strategy)) {
    out.kind = schedule_kind::infeasible;
    out.reason = explain_infeasible(cluster, request, compiled, empty);
    return out;
  }
  out.reason = explain_pending(cluster, request, compiled, now);
  return out;
}

} // namespace

schedule_result schedule(const cluster_state& cluster, const placement_request& request) {
  return run_schedule(cluster, request, true);
}

namespace detail {

schedule_result schedule_quiet(const cluster_state& cluster, const placement_request& request) {
  return run_schedule(cluster, request, false);
}

} // namespace detail

} // namespace rlforge::placement
