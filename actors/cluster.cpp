#include "actors/cluster.hpp"

#include <unistd.h>

#include <map>
#include <random>

#include <caf/all.hpp>

#include "actors/node.hpp"
#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "runtime/cluster_endpoint.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

/// The registry key of a driver's session.
constexpr caf::atom_value session_key = caf::atom("rlfcluster");

struct session_state {
  head_actor head;
  std::string driver_id;
  std::string endpoint;
  std::string lost; ///< why the head is gone (empty while it is there)
  static const char* name;
};

const char* session_state::name = "rlforge.cluster_session";

using session_ptr = caf::stateful_actor<session_state>*;

caf::error head_lost(const session_state& st) {
  return make_error(errc::io_error, "the cluster head at " + st.endpoint + " is lost ("
                                      + st.lost + "): its nodes stopped this driver's ranks; "
                                        "restart the driver once the head is back");
}

/// Forwards a request to the head, which answers the original requester directly (within the
/// requester's own deadline); once the head is lost, answers a clear error instead.
template <class... Ts>
caf::response_promise forward(session_ptr self, Ts&&... xs) {
  auto promise = self->make_response_promise();
  auto& st = self->state;
  if (!st.lost.empty())
    promise.deliver(head_lost(st));
  else
    promise.delegate(caf::actor_cast<caf::actor>(st.head), std::forward<Ts>(xs)...);
  return promise;
}

caf::behavior session(session_ptr self, head_actor head, std::string driver_id,
                      std::string endpoint) {
  auto& st = self->state;
  st.head = std::move(head);
  st.driver_id = std::move(driver_id);
  st.endpoint = std::move(endpoint);
  self->monitor(st.head);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.head.address())
      return;
    st.lost = self->system().render(dm.reason);
    runtime::logger("actors.cluster")->error("head_lost endpoint={} reason={}", st.endpoint,
                                             st.lost);
  });
  return {
    [=](caf::get_atom) -> caf::result<caf::actor, std::string, std::string> {
      auto& st = self->state;
      if (!st.lost.empty())
        return head_lost(st);
      return {caf::actor_cast<caf::actor>(st.head), st.driver_id, st.endpoint};
    },
    [=](pg_create_atom, const placement_group_request& req) {
      return forward(self, pg_create_atom::value, req);
    },
    [=](pg_remove_atom, const std::string& name) {
      return forward(self, pg_remove_atom::value, name);
    },
    [=](pg_get_atom, const std::string& name) {
      return forward(self, pg_get_atom::value, name);
    },
    [=](pg_table_atom) { return forward(self, pg_table_atom::value); },
    [=](reserve_atom, const std::string& group, uint32_t bundle, const resource_amounts& r) {
      return forward(self, reserve_atom::value, group, bundle, r);
    },
    [=](release_atom, const std::string& group, uint64_t id) {
      return forward(self, release_atom::value, group, id);
    },
    [=](lookup_atom, const std::string& node) {
      return forward(self, lookup_atom::value, node);
    },
    [=](cluster_status_atom) { return forward(self, cluster_status_atom::value); },
    [=](group_up_atom, const group_record& record) {
      auto& st = self->state;
      if (st.lost.empty())
        self->send(st.head, group_up_atom::value, st.driver_id, record);
    },
    [=](group_down_atom, const std::string& name) {
      auto& st = self->state;
      if (st.lost.empty())
        self->send(st.head, group_down_atom::value, st.driver_id, name);
    },
  };
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string new_driver_id() {
  std::random_device rd;
  char nonce[9];
  std::snprintf(nonce, sizeof(nonce), "%08x", rd());
  return host_name() + ":" + std::to_string(::getpid()) + ":" + nonce;
}

} // namespace

caf::expected<caf::actor> attach_cluster(caf::actor_system& sys,
                                         const runtime::system_config& cfg) {
  auto at = runtime::parse_endpoint(cfg.cluster);
  if (!at)
    return make_error(errc::invalid_argument, "--cluster: " + error_message(at.error()));
  auto where = runtime::to_string(*at);
  auto head = runtime::connect_actor<head_actor>(sys, *at, "the cluster head at " + where);
  if (!head)
    return std::move(head.error());
  driver_hello hello;
  hello.driver_id = new_driver_id();
  hello.version = rlforge_version();
  hello.wire_types = wire_signature(sys);
  hello.host = host_name();
  hello.pid = static_cast<int64_t>(::getpid());
  // Hidden: the session lives as long as the driver's actor system unless the driver stops it
  // (stop_placement_manager); the system's shutdown does not wait for it.
  auto s = sys.spawn<caf::hidden>(session, *head, hello.driver_id, where);
  caf::scoped_actor self{sys};
  caf::error failure;
  self->request(*head, std::chrono::seconds(15), attach_atom::value, hello, s)
    .receive([](join_reply&) {}, [&](caf::error& err) { failure = std::move(err); });
  if (failure) {
    caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    return runtime::connection_error(sys, failure, "the cluster head at " + where);
  }
  sys.registry().put(session_key, caf::actor_cast<caf::strong_actor_ptr>(s));
  runtime::logger("actors.cluster")->info("attached head={} driver={}", where, hello.driver_id);
  return s;
}

caf::expected<std::optional<cluster_session_info>> cluster_session(caf::actor_system& sys) {
  auto s = caf::actor_cast<caf::actor>(sys.registry().get(session_key));
  if (!s)
    return std::optional<cluster_session_info>{};
  caf::scoped_actor self{sys};
  caf::expected<std::optional<cluster_session_info>> out{caf::error{}};
  self->request(s, std::chrono::seconds(10), caf::get_atom::value)
    .receive(
      [&](caf::actor& head, std::string& id, std::string& endpoint) {
        out = std::optional<cluster_session_info>{cluster_session_info{
          s, caf::actor_cast<head_actor>(head), std::move(id), std::move(endpoint)}};
      },
      [&](caf::error& err) {
        if (err == caf::sec::request_receiver_down)
          out = make_error(errc::io_error, "this driver detached from its cluster");
        else
          out = std::move(err);
      });
  return out;
}

caf::expected<caf::actor> placement_manager_for(caf::actor_system& sys,
                                                const runtime::system_config& cfg,
                                                std::chrono::milliseconds pg_timeout) {
  if (cfg.cluster.empty())
    return spawn_placement_manager(sys, {local_node(cfg)}, pg_timeout);
  auto s = caf::actor_cast<caf::actor>(sys.registry().get(session_key));
  if (s)
    return s;
  return attach_cluster(sys, cfg);
}

void stop_placement_manager(const caf::actor& manager) {
  caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);
}

caf::expected<std::vector<caf::actor>>
spawn_cluster_ranks(caf::actor_system& sys, const cluster_session_info& cluster,
                    const std::string& kind, const std::vector<rank_info>& plan,
                    std::chrono::milliseconds timeout) {
  // The ranks of each node, in rank order.
  std::map<std::string, std::vector<size_t>> by_node;
  for (size_t i = 0; i < plan.size(); ++i)
    by_node[plan[i].node_id].push_back(i);
  caf::scoped_actor self{sys};
  std::vector<caf::actor> ranks(plan.size());
  auto stop_spawned = [&] {
    for (auto& r : ranks)
      if (r)
        caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  };
  const std::string group = plan.empty() ? std::string{} : plan.front().group;
  // Agents first (blocking connects), then one spawn request per node, all in flight at once.
  std::vector<std::pair<std::string, node_agent_actor>> agents;
  for (auto& [node, _] : by_node) {
    caf::error failure;
    node_endpoint ep;
    node_agent_actor agent;
    self->request(cluster.session, std::chrono::seconds(30), lookup_atom::value, node)
      .receive(
        [&](node_endpoint& e, node_agent_actor& a) {
          ep = std::move(e);
          agent = std::move(a);
        },
        [&](caf::error& err) { failure = std::move(err); });
    if (failure)
      return make_error(errc::rank_failed, "group '" + group + "': node '" + node
                                             + "': " + (error_message(failure).empty()
                                                          ? sys.render(failure)
                                                          : error_message(failure)));
    if (agent.node() != cluster.head.node()) {
      // A direct connection to the node (ranks' traffic does not go through the head).
      auto direct = runtime::connect_actor<node_agent_actor>(
        sys, {ep.address, ep.port},
        "node '" + node + "' at " + runtime::to_string(runtime::endpoint{ep.address, ep.port}));
      if (!direct)
        return make_error(errc::rank_failed,
                          "group '" + group + "': " + error_message(direct.error()));
      agent = std::move(*direct);
    }
    agents.emplace_back(node, std::move(agent));
  }
  std::vector<std::pair<std::string, decltype(self->request(agents.front().second, timeout,
                                                            spawn_ranks_atom::value, kind,
                                                            std::vector<rank_info>{},
                                                            cluster.session, cluster.driver_id))>>
    pending;
  for (auto& [node, agent] : agents) {
    std::vector<rank_info> infos;
    for (auto i : by_node[node])
      infos.push_back(plan[i]);
    pending.emplace_back(node, self->request(agent, timeout, spawn_ranks_atom::value, kind,
                                             std::move(infos), cluster.session,
                                             cluster.driver_id));
  }
  caf::error failure;
  for (auto& [node, handle] : pending) {
    handle.receive(
      [&, node = node](std::vector<rank_actor>& got) {
        const auto& idx = by_node[node];
        for (size_t j = 0; j < got.size() && j < idx.size(); ++j)
          ranks[idx[j]] = caf::actor_cast<caf::actor>(got[j]);
        if (got.size() != idx.size() && !failure)
          failure = make_error(errc::internal, "group '" + group + "': node '" + node
                                                 + "' spawned " + std::to_string(got.size())
                                                 + " ranks, asked for "
                                                 + std::to_string(idx.size()));
      },
      [&, node = node](caf::error& err) {
        if (!failure)
          failure = make_error(errc::rank_failed,
                               "group '" + group + "': node '" + node + "' did not spawn its ranks: "
                                 + (error_message(err).empty() ? sys.render(err)
                                                               : error_message(err)));
      });
  }
  if (failure) {
    stop_spawned();
    return failure;
  }
  return ranks;
}

void announce_group(const caf::actor& session, const group_record& record) {
  caf::anon_send(session, group_up_atom::value, record);
}

void retire_group(const caf::actor& session, const std::string& name) {
  caf::anon_send(session, group_down_atom::value, name);
}

} // namespace rlforge::actors
