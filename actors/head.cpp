#include "actors/head.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/head_metrics.hpp"
#include "actors/head_store.hpp"
#include "actors/local_exit.hpp"
#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct node_entry {
  node_join_request req;
  node_agent_actor agent;
  bool alive = true;
  /// Restored from the state file and not joined again yet: alive, its resources kept, no
  /// agent (declared dead if not back within the rejoin grace).
  bool rejoining = false;
  clock_type::time_point last_heartbeat;
  std::string death;
  node_heartbeat census;
};

struct driver_entry {
  driver_hello hello;
  caf::actor session; ///< none for a driver restored from the state file, until it attaches
};

struct head_state {
  head_options opts;
  caf::actor manager;
  std::string cluster_id;
  std::vector<std::string> wire;
  std::vector<std::string> kinds;
  std::map<std::string, node_entry> nodes;
  std::map<std::string, driver_entry> drivers;  ///< by driver id
  std::map<std::string, std::string> pg_owner;  ///< placement group → driver id
  /// An actor group a driver announced, and why it failed ("" while every node it has ranks on
  /// stayed alive). A failure sticks: a node that comes back has lost its ranks.
  struct group_entry {
    group_record record;
    std::string failed;
  };
  std::map<std::pair<std::string, std::string>, group_entry> groups; ///< (driver, name)
  /// Counters and histograms of events; gauges are read at each scrape (head_metrics.hpp).
  std::shared_ptr<runtime::metrics_registry> metrics =
      std::make_shared<runtime::metrics_registry>();
  /// The state file (head_options::state_path), or none.
  std::shared_ptr<head_store> store;
  /// When the registry was restored from the state file (rejoin grace), if it was.
  std::optional<clock_type::time_point> restored_at;
  static const char* name;
};

const char* head_state::name = "rlforge.head";

using head_ptr = head_actor::stateful_pointer<head_state>;

auto log() {
  return runtime::logger("actors.head");
}

std::string random_id() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

int64_t ms_since(clock_type::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t).count();
}

/// Saves the registry to the state file, if there is one. A failed write is logged (the head
/// goes on; a restart would find the previous registry).
void persist(head_ptr self) {
  auto& st = self->state;
  if (!st.store)
    return;
  head_registry r;
  r.cluster_id = st.cluster_id;
  r.version = rlforge_version();
  r.wire = st.wire;
  for (auto& [id, e] : st.nodes)
    r.nodes.push_back({e.req, e.alive, e.death});
  for (auto& [id, d] : st.drivers)
    r.drivers.push_back(d.hello);
  for (auto& [key, g] : st.groups)
    r.groups.push_back({key.first, g.record, g.failed});
  r.pg_owner = st.pg_owner;
  try {
    st.store->save(r);
  } catch (const std::exception& e) {
    log()->error("state_write_failed error={}", e.what());
  }
}

/// Appends a placement operation (head_store.hpp `placement_op`) to the state file's log.
template <class... Ts> void log_op(head_ptr self, const char* kind, Ts... args) {
  auto& st = self->state;
  if (!st.store)
    return;
  placement_op op{kind, {}};
  caf::binary_serializer sink{nullptr, op.args};
  if (sink(args...)) {
    log()->error("state_write_failed error=cannot encode placement op {}", kind);
    return;
  }
  try {
    st.store->append(op);
  } catch (const std::exception& e) {
    log()->error("state_write_failed error={}", e.what());
  }
}

/// The error a refused join or attach answers with.
caf::error refused(errc code, const std::string& what) {
  return make_error(code, "join refused: " + what);
}

caf::error check_node_id(const std::string& id) {
  if (id.empty())
    return refused(errc::invalid_argument, "the node id is empty");
  if (id.size() > 64)
    return refused(errc::invalid_argument, "node id '" + id + "' is longer than 64 characters");
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return refused(errc::invalid_argument,
                     "node id '" + id + "' may only hold letters, digits, '-', '_' and '.'");
  return caf::error{};
}

std::string list(const std::vector<std::string>& xs) {
  std::string out;
  for (auto& x : xs)
    out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "none" : out;
}

/// "missing a, b; extra c" between the head's kinds and a node's (`kind_interfaces`: kind names
/// and each op with its signature, so a differing op is named).
std::string kinds_difference(const std::vector<std::string>& head,
                             const std::vector<std::string>& node) {
  std::set<std::string> h(head.begin(), head.end()), n(node.begin(), node.end());
  std::vector<std::string> missing, extra;
  std::set_difference(h.begin(), h.end(), n.begin(), n.end(), std::back_inserter(missing));
  std::set_difference(n.begin(), n.end(), h.begin(), h.end(), std::back_inserter(extra));
  if (missing.empty() && extra.empty())
    return {};
  return "it lacks kinds [" + list(missing) + "] and has kinds the head lacks [" + list(extra)
         + "]";
}

/// The driver whose session lives on `node` (the process a request came from), or "".
std::string driver_on(const head_state& st, const caf::node_id& node) {
  for (auto& [id, d] : st.drivers)
    if (d.session.node() == node)
      return id;
  return {};
}

join_reply reply_of(const head_state& st) {
  return {st.cluster_id, rlforge_version(), st.opts.heartbeat.count(), st.opts.dead_after.count()};
}

void declare_dead(head_ptr self, const std::string& id, const std::string& reason, bool tell) {
  auto& st = self->state;
  auto i = st.nodes.find(id);
  if (i == st.nodes.end() || !i->second.alive)
    return;
  auto& e = i->second;
  e.alive = false;
  e.rejoining = false;
  e.death = reason;
  e.census = {};
  count_node_death(*st.metrics);
  if (e.agent) {
    self->demonitor(e.agent.address());
    if (tell)
      self->send(e.agent, leave_atom::value, reason);
  }
  log()->error("node_dead node={} reason={}", id, reason);
  for (auto& [key, g] : st.groups)
    if (g.failed.empty() &&
        std::count(g.record.rank_nodes.begin(), g.record.rank_nodes.end(), id) > 0)
      g.failed = "failed: node '" + id + "' died (" + reason + ")";
  persist(self);
  log_op(self, "remove_node", id, reason);
  self->request(st.manager, std::chrono::seconds(30), remove_node_atom::value, id, reason)
    .then(
      [=](std::vector<std::string>& failed) {
        if (!failed.empty())
          log()->error("pg_failed node={} groups={}", id, list(failed));
      },
      [=](caf::error& err) {
        log()->error("remove_node_failed node={} error={}", id, self->system().render(err));
      });
}

/// `id` is a copy: callers pass the key of the `drivers` entry this erases.
void driver_gone(head_ptr self, std::string id, const std::string& reason) {
  auto& st = self->state;
  std::vector<std::string> pgs;
  for (auto& [pg, owner] : st.pg_owner)
    if (owner == id)
      pgs.push_back(pg);
  for (auto& pg : pgs) {
    st.pg_owner.erase(pg);
    log_op(self, "remove", pg);
    self->request(st.manager, std::chrono::seconds(30), pg_remove_atom::value, pg)
      .then([] {}, [=](caf::error&) { /* already gone with a node */ });
  }
  for (auto i = st.groups.begin(); i != st.groups.end();)
    i = i->first.first == id ? st.groups.erase(i) : std::next(i);
  st.drivers.erase(id);
  persist(self);
  log()->info("driver_gone driver={} placement_groups={} reason={}", id, list(pgs), reason);
}

/// Forwards a request to the manager, which answers the original requester directly.
template <class... Ts>
caf::response_promise forward(head_ptr self, Ts&&... xs) {
  auto promise = self->make_response_promise();
  promise.delegate(self->state.manager, std::forward<Ts>(xs)...);
  return promise;
}

std::string status_json(head_ptr self, const std::string& placement) {
  auto& st = self->state;
  nlohmann::json doc;
  doc["cluster_id"] = st.cluster_id;
  doc["version"] = rlforge_version();
  auto pl = nlohmann::json::parse(placement, nullptr, false);
  std::map<std::string, nlohmann::json> usage;
  if (!pl.is_discarded())
    for (auto& n : pl["nodes"])
      usage[n["id"].get<std::string>()] = n;
  doc["nodes"] = nlohmann::json::array();
  for (auto& [id, e] : st.nodes) {
    auto& r = e.req.resources;
    nlohmann::json n{{"id", id},
                     {"alive", e.alive},
                     {"address", e.req.address},
                     {"port", e.req.port},
                     {"host", e.req.host},
                     {"pid", e.req.pid},
                     {"declared",
                      {{"gpus", r.gpus},
                       {"cpus", r.cpus},
                       {"memory_bytes", r.memory_bytes},
                       {"virtual_gpus", r.virtual_gpus}}},
                     {"last_heartbeat_ms", ms_since(e.last_heartbeat)}};
    if (auto u = usage.find(id); u != usage.end()) {
      n["total"] = u->second["total"];
      n["available"] = u->second["available"];
    }
    int32_t ranks = 0;
    for (auto c : e.census.ranks)
      ranks += c;
    n["ranks"] = ranks;
    if (!e.alive)
      n["death"] = e.death;
    if (e.rejoining)
      n["rejoining"] = true;
    doc["nodes"].push_back(std::move(n));
  }
  doc["placement_groups"] = nlohmann::json::array();
  if (!pl.is_discarded())
    for (auto& g : pl["groups"]) {
      auto owner = st.pg_owner.find(g["name"].get<std::string>());
      g["owner"] = owner == st.pg_owner.end() ? "" : owner->second;
      doc["placement_groups"].push_back(g);
    }
  doc["actor_groups"] = nlohmann::json::array();
  for (auto& [key, entry] : st.groups) {
    const auto& g = entry.record;
    std::string state = entry.failed.empty() ? "alive" : entry.failed;
    for (auto& n : g.rank_nodes)
      if (st.nodes.count(n) == 0 && entry.failed.empty())
        state = "failed: node '" + n + "' is not in the cluster";
    doc["actor_groups"].push_back({{"name", g.name},
                                   {"kind", g.kind},
                                   {"owner", key.first},
                                   {"placement_group", g.placement_group},
                                   {"rank_nodes", g.rank_nodes},
                                   {"state", state}});
  }
  doc["drivers"] = nlohmann::json::array();
  for (auto& [id, d] : st.drivers)
    doc["drivers"].push_back({{"id", id}, {"host", d.hello.host}, {"pid", d.hello.pid}});
  return doc.dump();
}

/// Replays the state file's placement operations into the new manager, in order (the head's
/// requests reach it in the order they are sent).
void replay(head_ptr self, const std::vector<placement_op>& ops) {
  auto& st = self->state;
  const auto t = std::chrono::seconds(30);
  for (const auto& op : ops) {
    caf::binary_deserializer source{nullptr, op.args};
    auto failed = [=, kind = op.kind](caf::error& err) {
      log()->warn("state_replay_failed op={} error={}", kind, self->system().render(err));
    };
    caf::error bad;
    if (op.kind == "add_node") {
      node_resources r;
      if (!(bad = source(r)))
        self->request(st.manager, t, add_node_atom::value, r).then([] {}, failed);
    } else if (op.kind == "remove_node") {
      std::string id, reason;
      if (!(bad = source(id, reason)))
        self->request(st.manager, t, remove_node_atom::value, id, reason)
          .then([](std::vector<std::string>&) {}, failed);
    } else if (op.kind == "create") {
      placement_group_request req;
      if (!(bad = source(req)))
        self->request(st.manager, t, pg_create_atom::value, req)
          .then([](placement_group_info&) {}, failed);
    } else if (op.kind == "remove") {
      std::string name;
      if (!(bad = source(name)))
        self->request(st.manager, t, pg_remove_atom::value, name).then([] {}, failed);
    } else if (op.kind == "reserve") {
      std::string group;
      uint32_t bundle = 0;
      resource_amounts amounts;
      uint64_t id = 0;
      if (!(bad = source(group, bundle, amounts, id)))
        self->request(st.manager, t, reserve_atom::value, group, bundle, amounts)
          .then(
            [=](uint64_t got) {
              if (got != id)
                log()->error("state_replay_diverged group={} reservation={} got={}", group, id,
                             got);
            },
            failed);
    } else if (op.kind == "release") {
      std::string group;
      uint64_t id = 0;
      if (!(bad = source(group, id)))
        self->request(st.manager, t, release_atom::value, group, id).then([] {}, failed);
    } else {
      log()->error("state_replay_failed op={} error=unknown operation", op.kind);
    }
    if (bad)
      log()->error("state_replay_failed op={} error=cannot decode it", op.kind);
  }
}

/// Takes the cluster back from a saved registry: its id, nodes (alive ones rejoining), drivers
/// (attaching again), actor groups, owners, and the placement table (`replay`).
void restore(head_ptr self, const head_registry& saved, const std::vector<placement_op>& ops) {
  auto& st = self->state;
  st.cluster_id = saved.cluster_id;
  for (const auto& n : saved.nodes) {
    node_entry e;
    e.req = n.request;
    e.alive = n.alive;
    e.rejoining = n.alive;
    e.death = n.death;
    e.last_heartbeat = clock_type::now();
    st.nodes[n.request.resources.node_id] = std::move(e);
  }
  for (const auto& d : saved.drivers)
    st.drivers[d.driver_id] = driver_entry{d, caf::actor{}};
  for (const auto& g : saved.groups)
    st.groups[{g.driver, g.record.name}] = {g.record, g.failed};
  st.pg_owner = saved.pg_owner;
  st.restored_at = clock_type::now();
  replay(self, ops);
  log()->warn("state_restored file={} cluster={} nodes={} drivers={} actor_groups={} "
              "placement_ops={} rejoin_grace_ms={}",
              st.store->path(), st.cluster_id, saved.nodes.size(), saved.drivers.size(),
              saved.groups.size(), ops.size(), st.opts.rejoin_grace.count());
}

/// What a restarted head's grace leaves: saved nodes not joined again are declared dead, saved
/// drivers not attached again are gone.
void end_rejoin_grace(head_ptr self) {
  auto& st = self->state;
  const auto why = std::to_string(st.opts.rejoin_grace.count()) + " ms of the head's restart";
  std::vector<std::string> late, gone;
  for (auto& [id, e] : st.nodes)
    if (e.rejoining)
      late.push_back(id);
  for (auto& [id, d] : st.drivers)
    if (!d.session)
      gone.push_back(id);
  for (auto& id : late)
    declare_dead(self, id, "did not join again within " + why, false);
  for (auto& id : gone)
    driver_gone(self, id, "did not attach again within " + why);
  st.restored_at.reset();
}

/// What `spawn_head` read from the state file.
struct head_start {
  std::shared_ptr<head_store> store;
  std::optional<head_registry> saved;
  std::vector<placement_op> ops;
};

head_actor::behavior_type head(head_ptr self, head_options opts, head_start start) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.wire = wire_signature(self->system());
  st.kinds = kind_interfaces();
  st.manager = spawn_placement_manager(self->system(), {}, st.opts.pg_timeout);
  self->attach_functor([manager = st.manager](const caf::error&) {
    caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);
  });
  st.store = start.store;
  if (start.saved) {
    restore(self, *start.saved, start.ops);
  } else {
    st.cluster_id = random_id();
    persist(self);
  }
  self->set_exit_handler([=](caf::exit_msg& msg) {
    if (!local_exit(msg.source, self->address())) {
      log()->warn("ignored_exit_from_elsewhere reason={}", self->system().render(msg.reason));
      return;
    }
    self->quit(msg.reason);
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& [id, e] : st.nodes)
      if (e.alive && e.agent.address() == dm.source) {
        declare_dead(self, id,
                     "lost its connection (" + self->system().render(dm.reason) + ")", false);
        return;
      }
    for (auto& [id, d] : st.drivers)
      if (d.session.address() == dm.source) {
        driver_gone(self, id, self->system().render(dm.reason));
        return;
      }
  });
  self->send(self, cluster_tick_atom::value);
  return {
    [=](join_atom, node_join_request& req,
        const node_agent_actor& agent) -> caf::result<join_reply> {
      auto& st = self->state;
      const auto id = req.resources.node_id;
      const auto who = "node '" + id + "'";
      if (auto err = check_node_id(id))
        return err;
      if (!agent)
        return refused(errc::invalid_argument, who + " sent no agent");
      if (auto m = describe_mismatch(who, "head", req.version, req.wire_types, st.wire);
          !m.empty())
        return refused(errc::unsupported, m);
      if (auto d = kinds_difference(st.kinds, req.kinds); !d.empty())
        return refused(errc::unsupported,
                       who + " was built with other actor kinds or ops than the head: " + d);
      if (auto i = st.nodes.find(id); i != st.nodes.end() && i->second.rejoining) {
        // A node of the saved registry, back after the head's restart: its resources and
        // reservations are in the restored table already.
        auto& e = i->second;
        if (!(e.req.resources == req.resources))
          return refused(errc::invalid_argument,
                         who + " joins again with other resources than before the head "
                               "restarted; stop it and start it again, or pick another --node-id");
        e.req = req;
        e.agent = agent;
        e.rejoining = false;
        e.last_heartbeat = clock_type::now();
        self->monitor(agent);
        persist(self);
        log()->warn("node_rejoined node={} address={}:{}", id, req.address, req.port);
        return reply_of(st);
      }
      if (auto i = st.nodes.find(id); i != st.nodes.end() && i->second.alive)
        return refused(errc::already_exists,
                       who + " is already in the cluster (from host " + i->second.req.host
                         + " pid " + std::to_string(i->second.req.pid) + ", last heartbeat "
                         + std::to_string(ms_since(i->second.last_heartbeat))
                         + " ms ago); pick another --node-id or stop that node first");
      if (req.address.empty() || (req.port == 0 && agent.node() != self->node()))
        return refused(errc::invalid_argument,
                       who + " gave no address and port where its agent listens");
      auto promise = self->make_response_promise<join_reply>();
      log_op(self, "add_node", req.resources);
      self->request(self->state.manager, std::chrono::seconds(30), add_node_atom::value,
                    req.resources)
        .then(
          [=]() mutable {
            auto& st = self->state;
            node_entry e;
            e.req = req;
            e.agent = agent;
            e.last_heartbeat = clock_type::now();
            st.nodes[id] = std::move(e);
            self->monitor(agent);
            persist(self);
            log()->info("node_joined node={} address={}:{} gpus={} cpus={}", id, req.address,
                        req.port, req.resources.gpus, req.resources.cpus);
            promise.deliver(reply_of(st));
          },
          [=](caf::error& err) mutable {
            auto msg = error_message(err).empty() ? self->system().render(err)
                                                  : error_message(err);
            promise.deliver(refused(errc::invalid_argument, who + ": " + msg));
          });
      return promise;
    },
    [=](leave_atom, const std::string& id) {
      auto& st = self->state;
      auto i = st.nodes.find(id);
      auto sender = self->current_sender();
      if (i == st.nodes.end() || !sender || sender->node() != i->second.agent.node())
        return; // only a node itself leaves
      declare_dead(self, id, "left the cluster", false);
    },
    [=](heartbeat_atom, node_heartbeat& hb) {
      auto& st = self->state;
      auto i = st.nodes.find(hb.node_id);
      auto sender = self->current_sender();
      if (i == st.nodes.end() || !sender || sender->address() != i->second.agent.address())
        return;
      if (!i->second.alive) {
        // Declared dead while it still talks: it must stop its ranks and join again.
        self->send(i->second.agent, leave_atom::value, i->second.death);
        return;
      }
      i->second.last_heartbeat = clock_type::now();
      i->second.census = std::move(hb);
      count_heartbeat(*st.metrics);
    },
    [=](attach_atom, driver_hello& hello, const caf::actor& session) -> caf::result<join_reply> {
      auto& st = self->state;
      const auto who = "driver '" + hello.driver_id + "'";
      if (hello.driver_id.empty())
        return refused(errc::invalid_argument, "a driver sent an empty driver id");
      if (!session)
        return refused(errc::invalid_argument, who + " sent no session actor");
      if (auto m = describe_mismatch(who, "head", hello.version, hello.wire_types, st.wire);
          !m.empty())
        return refused(errc::unsupported, m);
      if (auto i = st.drivers.find(hello.driver_id); i != st.drivers.end()) {
        if (i->second.session)
          return refused(errc::already_exists, who + " is already attached");
        // A driver of the saved registry, back after the head's restart.
        self->monitor(session);
        i->second = driver_entry{hello, session};
        persist(self);
        log()->warn("driver_attached_again driver={} host={} pid={}", hello.driver_id,
                    hello.host, hello.pid);
        return reply_of(st);
      }
      self->monitor(session);
      st.drivers[hello.driver_id] = driver_entry{hello, session};
      persist(self);
      log()->info("driver_attached driver={} host={} pid={}", hello.driver_id, hello.host,
                  hello.pid);
      return reply_of(st);
    },
    [=](lookup_atom, const std::string& id) -> caf::result<node_endpoint, node_agent_actor> {
      auto& st = self->state;
      auto i = st.nodes.find(id);
      if (i == st.nodes.end())
        return make_error(errc::not_found, "node '" + id + "' is not in the cluster");
      if (!i->second.alive)
        return make_error(errc::rank_failed, "node '" + id + "' is dead: " + i->second.death);
      if (i->second.rejoining)
        return make_error(errc::unsupported, "node '" + id + "' has not joined again since the "
                                             "head restarted; retry");
      return {node_endpoint{id, i->second.req.address, i->second.req.port}, i->second.agent};
    },
    [=](pg_create_atom, const placement_group_request& req) -> caf::result<placement_group_info> {
      auto& st = self->state;
      auto sender = self->current_sender();
      auto owner = sender ? driver_on(st, sender->node()) : std::string{};
      auto wait = req.timeout_s > 0
                    ? std::chrono::milliseconds{static_cast<int64_t>(req.timeout_s * 1000)}
                    : st.opts.pg_timeout;
      auto promise = self->make_response_promise<placement_group_info>();
      self->request(st.manager, wait + std::chrono::seconds(10), pg_create_atom::value, req)
        .then(
          [=](placement_group_info& info) mutable {
            log_op(self, "create", req);
            if (!owner.empty())
              self->state.pg_owner[info.name] = owner;
            persist(self);
            promise.deliver(std::move(info));
          },
          [=](caf::error& err) mutable { promise.deliver(std::move(err)); });
      return promise;
    },
    [=](pg_remove_atom, const std::string& name) -> caf::result<void> {
      self->state.pg_owner.erase(name);
      log_op(self, "remove", name);
      persist(self);
      return forward(self, pg_remove_atom::value, name);
    },
    [=](pg_get_atom, const std::string& name) -> caf::result<placement_group_info> {
      return forward(self, pg_get_atom::value, name);
    },
    [=](pg_table_atom) -> caf::result<std::string> {
      return forward(self, pg_table_atom::value);
    },
    [=](reserve_atom, const std::string& group, uint32_t bundle,
        const resource_amounts& amounts) -> caf::result<uint64_t> {
      auto promise = self->make_response_promise<uint64_t>();
      self->request(self->state.manager, std::chrono::seconds(30), reserve_atom::value, group,
                    bundle, amounts)
        .then(
          [=](uint64_t id) mutable {
            log_op(self, "reserve", group, bundle, amounts, id);
            promise.deliver(id);
          },
          [=](caf::error& err) mutable { promise.deliver(std::move(err)); });
      return promise;
    },
    [=](release_atom, const std::string& group, uint64_t id) -> caf::result<void> {
      log_op(self, "release", group, id);
      return forward(self, release_atom::value, group, id);
    },
    [=](group_up_atom, const std::string& driver, group_record& record) {
      auto& st = self->state;
      if (st.drivers.count(driver) == 0)
        return; // announced by a driver that is gone
      auto key = std::make_pair(driver, record.name);
      observe_spawn(*st.metrics, record.spawn_seconds);
      st.groups[key] = {std::move(record), ""};
      persist(self);
    },
    [=](group_down_atom, const std::string& driver, const std::string& name) {
      self->state.groups.erase({driver, name});
      persist(self);
    },
    [=](cluster_status_atom) -> caf::result<std::string> {
      auto promise = self->make_response_promise<std::string>();
      self->request(self->state.manager, std::chrono::seconds(30), pg_status_atom::value)
        .then([=](std::string& placement) mutable { promise.deliver(status_json(self, placement)); },
              [=](caf::error& err) mutable { promise.deliver(std::move(err)); });
      return promise;
    },
    [=](cluster_metrics_atom) -> caf::result<std::string> {
      auto promise = self->make_response_promise<std::string>();
      self->request(self->state.manager, std::chrono::seconds(30), pg_status_atom::value)
        .then(
          [=](std::string& placement) mutable {
            auto doc = nlohmann::json::parse(status_json(self, placement), nullptr, false);
            promise.deliver(head_metrics_text(doc, *self->state.metrics));
          },
          [=](caf::error& err) mutable { promise.deliver(std::move(err)); });
      return promise;
    },
    [=](cluster_tick_atom) {
      auto& st = self->state;
      auto limit = st.opts.dead_after + st.opts.heartbeat;
      std::vector<std::string> silent;
      for (auto& [id, e] : st.nodes)
        if (e.alive && !e.rejoining && clock_type::now() - e.last_heartbeat > limit)
          silent.push_back(id);
      if (st.restored_at && clock_type::now() - *st.restored_at > st.opts.rejoin_grace)
        end_rejoin_grace(self);
      for (auto& id : silent)
        declare_dead(self, id,
                     "sent no heartbeat for " + std::to_string(ms_since(st.nodes[id].last_heartbeat))
                       + " ms",
                     true);
      self->delayed_send(self, st.opts.heartbeat, cluster_tick_atom::value);
    },
  };
}

} // namespace

caf::expected<head_actor> spawn_head(caf::actor_system& sys, head_options opts) {
  head_start start;
  if (!opts.state_path.empty()) {
    try {
      start.store = std::make_shared<head_store>(opts.state_path);
      start.saved = start.store->registry();
      if (start.saved) {
        if (start.saved->version != rlforge_version() ||
            start.saved->wire != wire_signature(sys))
          return make_error(errc::unsupported,
                            "head state " + opts.state_path + " was written by rlforge " +
                                start.saved->version + " with another wire format than this " +
                                rlforge_version() + "; use a new file");
        start.ops = start.store->placement_log();
      }
    } catch (const std::exception& e) {
      return make_error(errc::io_error, e.what());
    }
  }
  return sys.spawn(head, std::move(opts), std::move(start));
}

} // namespace rlforge::actors
