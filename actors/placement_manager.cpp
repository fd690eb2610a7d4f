#include "actors/placement_manager.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/protocol.hpp"
#include "placement/cluster.hpp"
#include "placement/request.hpp"
#include "placement/table.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

namespace pl = rlforge::placement;

caf::error to_error(const pl::placement_error& e) {
  errc code = errc::invalid_argument;
  switch (e.code) {
    case pl::placement_errc::unknown_group:
    case pl::placement_errc::unknown_node:
    case pl::placement_errc::unknown_reservation:
      code = errc::not_found;
      break;
    case pl::placement_errc::duplicate_group:
    case pl::placement_errc::duplicate_node:
      code = errc::already_exists;
      break;
    case pl::placement_errc::index_out_of_range:
      code = errc::out_of_range;
      break;
    default:
      break;
  }
  return make_error(code, e.message);
}

caf::expected<pl::resource_set> to_resource_set(const resource_amounts& amounts,
                                                const std::string& what) {
  pl::resource_set out;
  for (auto& [name, value] : amounts)
    if (auto r = out.set(name, value); !r.ok())
      return make_error(errc::invalid_argument, what + ": " + r.error().message);
  return out;
}

resource_amounts to_amounts(const pl::resource_set& set) {
  resource_amounts out;
  for (auto& [name, units] : set)
    out[name] = static_cast<double>(units) / static_cast<double>(pl::units_per_whole);
  return out;
}

caf::expected<pl::node_spec> to_node_spec(const node_resources& node) {
  pl::resource_set extra;
  if (node.memory_bytes < 0)
    return make_error(errc::invalid_argument, "node '" + node.node_id
                                                + "': memory must be >= 0 bytes, got "
                                                + std::to_string(node.memory_bytes));
  if (node.memory_bytes > 0)
    if (auto r = extra.set(pl::memory_resource, static_cast<double>(node.memory_bytes)); !r.ok())
      return make_error(errc::invalid_argument, "node '" + node.node_id + "': " + r.error().message);
  for (auto& [name, value] : node.custom)
    if (auto r = extra.set(name, value); !r.ok())
      return make_error(errc::invalid_argument, "node '" + node.node_id + "': " + r.error().message);
  auto spec = pl::make_node(node.node_id, node.gpus, node.cpus, extra);
  if (!spec.ok())
    return to_error(spec.error());
  return std::move(spec.value());
}

placement_group_info to_info(const std::string& name, const std::string& strategy,
                             const std::vector<pl::placed_bundle>& bundles) {
  placement_group_info info;
  info.name = name;
  info.strategy = strategy;
  for (auto& b : bundles) {
    bundle_placement p;
    p.bundle_index = static_cast<uint32_t>(b.request_index);
    p.node_id = b.node_id;
    p.device_ids.assign(b.device_ids.begin(), b.device_ids.end());
    p.resources = to_amounts(b.resources);
    info.bundles.push_back(std::move(p));
  }
  return info;
}

struct waiting_group {
  caf::response_promise promise;
  std::string strategy;
  uint64_t generation = 0;
};

struct manager_state {
  pl::placement_table table;
  std::map<std::string, std::string> strategies; ///< per placed group
  std::map<std::string, std::string> failed;     ///< groups lost with a node: why
  std::unordered_map<std::string, waiting_group> waiting;
  uint64_t next_generation = 1;
  std::chrono::milliseconds default_timeout{180000};
  static const char* name;
};

const char* manager_state::name = "rlforge.placement_manager";

using manager_actor = caf::stateful_actor<manager_state>;

/// One info line per placement decision: the group, its strategy and each bundle's node.
void log_placed(const placement_group_info& pg, const char* event) {
  std::string nodes;
  for (const auto& b : pg.bundles)
    nodes += (nodes.empty() ? "" : ",") + std::to_string(b.bundle_index) + ":" + b.node_id;
  runtime::logger("placement")
      ->info("{} name={} strategy={} bundles={}", event, pg.name, pg.strategy, nodes);
}

/// Answers the waiters of groups the table just placed.
void deliver_placed(manager_actor* self, const std::vector<std::string>& placed) {
  auto& st = self->state;
  for (auto& name : placed) {
    auto i = st.waiting.find(name);
    if (i == st.waiting.end())
      continue;
    auto bundles = st.table.bundles(name);
    st.strategies[name] = i->second.strategy;
    if (bundles.ok()) {
      auto info = to_info(name, i->second.strategy, bundles.value());
      log_placed(info, "pg_placed_after_wait");
      i->second.promise.deliver(std::move(info));
    } else {
      i->second.promise.deliver(to_error(bundles.error()));
    }
    st.waiting.erase(i);
  }
}

/// The error for a group that failed with its node, or none.
caf::error failed_error(const manager_state& st, const std::string& name) {
  auto i = st.failed.find(name);
  if (i == st.failed.end())
    return caf::error{};
  return make_error(errc::rank_failed, "placement group '" + name + "' failed: " + i->second
                                         + " (remove it; its resources are gone)");
}

/// The manager's state as JSON (see `pg_status_atom`).
std::string status_json(const manager_state& st) {
  nlohmann::json doc;
  doc["nodes"] = nlohmann::json::array();
  for (auto& n : st.table.cluster().nodes()) {
    nlohmann::json node{{"id", n.id},
                        {"total", to_amounts(n.total)},
                        {"available", to_amounts(n.available)}};
    doc["nodes"].push_back(std::move(node));
  }
  doc["groups"] = nlohmann::json::array();
  for (auto& name : st.table.placed()) {
    auto bundles = st.table.bundles(name);
    nlohmann::json g{{"name", name}, {"state", "placed"}, {"bundles", nlohmann::json::array()}};
    auto s = st.strategies.find(name);
    g["strategy"] = s == st.strategies.end() ? "" : s->second;
    if (bundles.ok())
      for (auto& b : bundles.value())
        g["bundles"].push_back({{"index", b.request_index},
                                {"node", b.node_id},
                                {"devices", std::vector<int32_t>(b.device_ids.begin(),
                                                                 b.device_ids.end())},
                                {"resources", to_amounts(b.resources)}});
    doc["groups"].push_back(std::move(g));
  }
  for (auto& name : st.table.pending()) {
    auto reason = st.table.pending_reason(name);
    doc["groups"].push_back({{"name", name},
                             {"state", "pending"},
                             {"reason", reason.ok() ? reason.value() : std::string{}}});
  }
  for (auto& [name, why] : st.failed)
    doc["groups"].push_back({{"name", name}, {"state", "failed"}, {"reason", why}});
  return doc.dump();
}

caf::behavior manager(manager_actor* self, std::vector<node_resources> nodes,
                      std::chrono::milliseconds default_timeout) {
  auto& st = self->state;
  st.default_timeout = default_timeout;
  for (auto& n : nodes) {
    auto spec = to_node_spec(n);
    if (!spec) {
      runtime::logger("placement")->error("bad_node {}", error_message(spec.error()));
      continue;
    }
    auto r = st.table.add_node(*spec);
    if (!r.ok())
      runtime::logger("placement")->error("bad_node {}", r.error().message);
  }
  return {
    [=](pg_create_atom, const placement_group_request& req)
      -> caf::result<placement_group_info> {
      auto& st = self->state;
      if (req.name.empty())
        return make_error(errc::invalid_argument, "placement group name must not be empty");
      if (!std::isfinite(req.timeout_s) || req.timeout_s < 0)
        return make_error(errc::invalid_argument,
                          "placement group '" + req.name
                            + "': timeout must be a finite number of seconds > 0 (0 = default), got "
                            + std::to_string(req.timeout_s));
      if (st.waiting.count(req.name) > 0 || st.table.state(req.name))
        return make_error(errc::already_exists,
                          "placement group '" + req.name + "' already exists");
      // A group lost with its node may be created again under its name.
      st.failed.erase(req.name);
      std::vector<pl::resource_set> bundles;
      for (size_t i = 0; i < req.bundles.size(); ++i) {
        auto set = to_resource_set(req.bundles[i], "placement group '" + req.name + "' bundle "
                                                     + std::to_string(i));
        if (!set)
          return std::move(set.error());
        bundles.push_back(std::move(*set));
      }
      auto request = pl::make_request(req.strategy, std::move(bundles));
      if (!request.ok())
        return make_error(errc::invalid_argument,
                          "placement group '" + req.name + "': " + request.error().message);
      auto res = st.table.create(req.name, std::move(request.value()));
      switch (res.kind) {
        case pl::schedule_kind::placed: {
          st.strategies[req.name] = req.strategy;
          auto info = to_info(req.name, req.strategy, res.bundles);
          log_placed(info, "pg_placed");
          return info;
        }
        case pl::schedule_kind::infeasible:
          return make_error(errc::infeasible,
                            "placement group '" + req.name + "' is infeasible: " + res.reason);
        case pl::schedule_kind::invalid:
          return make_error(errc::invalid_argument,
                            "placement group '" + req.name + "': " + res.reason);
        case pl::schedule_kind::pending:
          break;
      }
      auto timeout = req.timeout_s > 0
                       ? std::chrono::milliseconds{static_cast<int64_t>(req.timeout_s * 1000)}
                       : st.default_timeout;
      auto gen = st.next_generation++;
      waiting_group w;
      w.promise = self->make_response_promise();
      w.strategy = req.strategy;
      w.generation = gen;
      auto promise = w.promise;
      st.waiting.emplace(req.name, std::move(w));
      runtime::logger("placement")->info("pg_pending name={} reason={}", req.name, res.reason);
      self->delayed_send(self, timeout, pg_expire_atom::value, req.name, gen,
                         static_cast<int64_t>(timeout.count()));
      return promise;
    },
    [=](pg_expire_atom, const std::string& name, uint64_t gen, int64_t timeout_ms) {
      auto& st = self->state;
      auto i = st.waiting.find(name);
      if (i == st.waiting.end() || i->second.generation != gen)
        return; // placed or removed in the meantime
      auto reason = st.table.pending_reason(name);
      st.table.cancel_pending(name);
      i->second.promise.deliver(make_error(
        errc::timeout, "placement group '" + name + "' still pending after "
                         + std::to_string(timeout_ms) + " ms: "
                         + (reason.ok() ? reason.value() : std::string{"resources are held"})));
      st.waiting.erase(i);
    },
    [=](pg_remove_atom, const std::string& name) -> caf::result<void> {
      auto& st = self->state;
      if (st.failed.erase(name) > 0)
        return caf::unit;
      if (auto i = st.waiting.find(name); i != st.waiting.end()) {
        i->second.promise.deliver(
          make_error(errc::not_found, "placement group '" + name + "' was removed while pending"));
        st.waiting.erase(i);
      }
      auto placed = st.table.remove(name);
      if (!placed.ok())
        return to_error(placed.error());
      st.strategies.erase(name);
      deliver_placed(self, placed.value());
      return caf::unit;
    },
    [=](pg_get_atom, const std::string& name) -> caf::result<placement_group_info> {
      auto& st = self->state;
      if (auto err = failed_error(st, name))
        return err;
      auto bundles = st.table.bundles(name);
      if (!bundles.ok())
        return to_error(bundles.error());
      return to_info(name, st.strategies[name], bundles.value());
    },
    [=](pg_table_atom) { return self->state.table.describe(); },
    [=](pg_status_atom) { return status_json(self->state); },
    [=](remove_node_atom, const std::string& node_id,
        const std::string& reason) -> caf::result<std::vector<std::string>> {
      auto& st = self->state;
      auto removal = st.table.remove_node(node_id, pl::evicted_groups::drop);
      if (!removal.ok())
        return to_error(removal.error());
      for (auto& name : removal.value().evicted) {
        st.failed[name] = "node '" + node_id + "' " + reason;
        st.strategies.erase(name);
        runtime::logger("placement")->warn("pg_failed name={} node={} reason={}", name, node_id,
                                           reason);
      }
      deliver_placed(self, removal.value().placed);
      return removal.value().evicted;
    },
    [=](add_node_atom, const node_resources& node) -> caf::result<void> {
      auto spec = to_node_spec(node);
      if (!spec)
        return std::move(spec.error());
      auto placed = self->state.table.add_node(*spec);
      if (!placed.ok())
        return to_error(placed.error());
      deliver_placed(self, placed.value());
      return caf::unit;
    },
    [=](reserve_atom, const std::string& group, uint32_t bundle,
        const resource_amounts& amounts) -> caf::result<uint64_t> {
      if (auto err = failed_error(self->state, group))
        return err;
      auto set = to_resource_set(amounts, "reservation in group '" + group + "' bundle "
                                            + std::to_string(bundle));
      if (!set)
        return std::move(set.error());
      auto r = self->state.table.reserve_in_bundle(group, bundle, *set);
      if (!r.ok())
        return to_error(r.error());
      return r.value().id;
    },
    [=](release_atom, const std::string& group, uint64_t id) -> caf::result<void> {
      if (self->state.failed.count(group) > 0)
        return caf::unit; // its reservations went with the node
      auto r = self->state.table.release_in_bundle(group, id);
      if (!r.ok())
        return to_error(r.error());
      return caf::unit;
    },
  };
}

template <class T, class... Ts>
caf::expected<T> ask(caf::actor_system& sys, const caf::actor& dest,
                     std::chrono::milliseconds timeout, Ts&&... xs) {
  caf::scoped_actor self{sys};
  caf::expected<T> out{caf::error{}};
  self->request(dest, timeout, std::forward<Ts>(xs)...)
    .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<void> ask_void(caf::actor_system& sys, const caf::actor& dest,
                             caf::message msg) {
  caf::scoped_actor self{sys};
  caf::expected<void> out{caf::unit};
  self->request(dest, std::chrono::seconds(30), std::move(msg))
    .receive([&] {}, [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace

caf::actor spawn_placement_manager(caf::actor_system& sys, std::vector<node_resources> nodes,
                                   std::chrono::milliseconds default_timeout) {
  return sys.spawn(manager, std::move(nodes), default_timeout);
}

placement_client::placement_client(caf::actor_system& sys, caf::actor manager)
  : sys_(&sys), manager_(std::move(manager)) {
}

caf::expected<placement_group_info>
placement_client::create(const placement_group_request& request) {
  // The manager answers within the request's own timeout; this deadline only guards against a
  // dead manager.
  auto wait = std::chrono::milliseconds{
    static_cast<int64_t>((request.timeout_s > 0 ? request.timeout_s : 3600.0) * 1000)};
  return ask<placement_group_info>(*sys_, manager_, wait + std::chrono::seconds(10),
                                   pg_create_atom::value, request);
}

caf::expected<void> placement_client::remove(const std::string& name) {
  return ask_void(*sys_, manager_, caf::make_message(pg_remove_atom::value, name));
}

caf::expected<placement_group_info> placement_client::get(const std::string& name) {
  return ask<placement_group_info>(*sys_, manager_, std::chrono::seconds(30),
                                   pg_get_atom::value, name);
}

caf::expected<std::string> placement_client::table() {
  return ask<std::string>(*sys_, manager_, std::chrono::seconds(30), pg_table_atom::value);
}

caf::expected<void> placement_client::add_node(const node_resources& node) {
  return ask_void(*sys_, manager_, caf::make_message(add_node_atom::value, node));
}

caf::expected<uint64_t> placement_client::reserve(const std::string& group, uint32_t bundle,
                                                  const resource_amounts& amounts) {
  return ask<uint64_t>(*sys_, manager_, std::chrono::seconds(30), reserve_atom::value, group,
                       bundle, amounts);
}

caf::expected<void> placement_client::release(const std::string& group, uint64_t reservation) {
  return ask_void(*sys_, manager_, caf::make_message(release_atom::value, group, reservation));
}

caf::expected<placement_group_info>
placement_client::place_again(placement_group_request request, std::chrono::milliseconds timeout,
                              const std::function<std::string(const placement_group_info&)>& accept) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_s = [&] {
    return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  };
  std::string why = "no attempt";
  while (left_s() > 0) {
    (void)remove(request.name); // failed with its node, or gone
    request.timeout_s = std::max(left_s(), 0.1);
    auto pg = create(request);
    if (pg) {
      why = accept(*pg);
      if (why.empty())
        return std::move(*pg);
    } else {
      why = "no room: " + sys_->render(pg.error());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  (void)remove(request.name);
  return make_error(errc::timeout, why);
}

} // namespace rlforge::actors
