#include "actors/head.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/head_metrics.hpp"
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
  clock_type::time_point last_heartbeat;
  std::string death;
  node_heartbeat census;
};

struct driver_entry {
  driver_hello hello;
  caf::actor session;
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

/// "missing a, b; extra c" between the head's kinds and a node's.
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
  e.death = reason;
  e.census = {};
  count_node_death(*st.metrics);
  self->demonitor(e.agent.address());
  if (tell)
    self->send(e.agent, leave_atom::value, reason);
  log()->error("node_dead node={} reason={}", id, reason);
  for (auto& [key, g] : st.groups)
    if (g.failed.empty() &&
        std::count(g.record.rank_nodes.begin(), g.record.rank_nodes.end(), id) > 0)
      g.failed = "failed: node '" + id + "' died (" + reason + ")";
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

void driver_gone(head_ptr self, const std::string& id, const std::string& reason) {
  auto& st = self->state;
  std::vector<std::string> pgs;
  for (auto& [pg, owner] : st.pg_owner)
    if (owner == id)
      pgs.push_back(pg);
  for (auto& pg : pgs) {
    st.pg_owner.erase(pg);
    self->request(st.manager, std::chrono::seconds(30), pg_remove_atom::value, pg)
      .then([] {}, [=](caf::error&) { /* already gone with a node */ });
  }
  for (auto i = st.groups.begin(); i != st.groups.end();)
    i = i->first.first == id ? st.groups.erase(i) : std::next(i);
  st.drivers.erase(id);
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

head_actor::behavior_type head(head_ptr self, head_options opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.cluster_id = random_id();
  st.wire = wire_signature(self->system());
  st.kinds = kind_names();
  st.manager = spawn_placement_manager(self->system(), {}, st.opts.pg_timeout);
  self->attach_functor([manager = st.manager](const caf::error&) {
    caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);
  });
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
                       who + " was built with other actor kinds than the head: " + d);
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
      if (st.drivers.count(hello.driver_id) > 0)
        return refused(errc::already_exists, who + " is already attached");
      self->monitor(session);
      st.drivers[hello.driver_id] = driver_entry{hello, session};
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
            if (!owner.empty())
              self->state.pg_owner[info.name] = owner;
            promise.deliver(std::move(info));
          },
          [=](caf::error& err) mutable { promise.deliver(std::move(err)); });
      return promise;
    },
    [=](pg_remove_atom, const std::string& name) -> caf::result<void> {
      self->state.pg_owner.erase(name);
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
      return forward(self, reserve_atom::value, group, bundle, amounts);
    },
    [=](release_atom, const std::string& group, uint64_t id) -> caf::result<void> {
      return forward(self, release_atom::value, group, id);
    },
    [=](group_up_atom, const std::string& driver, group_record& record) {
      auto& st = self->state;
      if (st.drivers.count(driver) == 0)
        return; // announced by a driver that is gone
      auto key = std::make_pair(driver, record.name);
      observe_spawn(*st.metrics, record.spawn_seconds);
      st.groups[key] = {std::move(record), ""};
    },
    [=](group_down_atom, const std::string& driver, const std::string& name) {
      self->state.groups.erase({driver, name});
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
        if (e.alive && clock_type::now() - e.last_heartbeat > limit)
          silent.push_back(id);
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

head_actor spawn_head(caf::actor_system& sys, head_options opts) {
  return sys.spawn(head, std::move(opts));
}

} // namespace rlforge::actors
