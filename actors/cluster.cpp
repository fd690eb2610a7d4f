#include "actors/cluster.hpp"

#include <unistd.h>

#include <map>
#include <optional>
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
/// The session's own messages: the cluster id its attach got; try to attach again; an attach
/// again succeeded (head, reply) or failed (why).
using cluster_id_atom = caf::atom_constant<caf::atom("rlfclid")>;
using reattach_atom = caf::atom_constant<caf::atom("rlfretry")>;
using reattached_atom = caf::atom_constant<caf::atom("rlfback")>;
using reattach_failed_atom = caf::atom_constant<caf::atom("rlfnoback")>;

/// How a session attaches (again).
struct session_args {
  driver_hello hello;
  runtime::endpoint at;
  std::string endpoint; ///< `at` as text
  std::chrono::milliseconds grace{0}; ///< how long to try attaching again to a lost head
};

struct session_state {
  head_actor head;
  session_args args;
  std::string cluster_id;
  std::string lost; ///< why the head is gone (empty while it is there)
  /// Since when the head is away while the session tries to attach again (within the grace).
  std::optional<std::chrono::steady_clock::time_point> away_since;
  caf::node_id lost_node; ///< the lost head's node
  int attempts = 0;        ///< attempts to attach again under way

  /// Idempotent requests that came while the head was away: sent once it is back, or answered
  /// with the loss when it is not.
  std::vector<std::pair<caf::response_promise, caf::message>> held;
  static const char* name;
};

const char* session_state::name = "rlforge.cluster_session";

using session_ptr = caf::stateful_actor<session_state>*;

caf::error head_lost(const session_state& st) {
  if (st.away_since)
    return make_error(errc::io_error,
                      "the cluster head at " + st.args.endpoint + " is lost (" + st.lost +
                          "); waiting up to " + std::to_string(st.args.grace.count()) +
                          " ms for it to come back (--head-grace-ms); retry");
  return make_error(errc::io_error, "the cluster head at " + st.args.endpoint + " is lost ("
                                      + st.lost + "): its nodes stopped this driver's ranks; "
                                        "restart the driver once the head is back");
}

/// One attempt to attach `session` to the head again, off the session's thread (connecting
/// blocks): tells the session how it went. `lost` is the lost head's node: CAF may hand back its
/// proxy while the old connection is torn down, and a request to it would only time out.
void try_attach_again(caf::actor_system& sys, caf::actor session, session_args args,
                      caf::node_id lost) {
  sys.spawn([session, args, lost](caf::blocking_actor* self) {
    auto head = runtime::connect_actor<head_actor>(self->system(), args.at,
                                                   "the cluster head at " + args.endpoint);
    if (!head || head->node() == lost) {
      self->send(session, reattach_failed_atom::value,
                 head ? std::string{"still the lost head"} : self->system().render(head.error()));
      return;
    }
    self->request(*head, std::chrono::seconds(3), attach_atom::value, args.hello, session)
      .receive(
        [&](join_reply& r) {
          self->send(session, reattached_atom::value, caf::actor_cast<caf::actor>(*head),
                     r.cluster_id);
        },
        [&](caf::error& err) {
          self->send(session, reattach_failed_atom::value, self->system().render(err));
        });
  });
}

/// Forwards a request to the head, which answers the original requester directly (within the
/// requester's own deadline); once the head is lost, answers a clear error instead, except
/// that an `idempotent` request (a read) waits while the session tries to attach again.
template <class... Ts>
caf::response_promise forward(session_ptr self, bool idempotent, Ts&&... xs) {
  auto promise = self->make_response_promise();
  auto& st = self->state;
  if (st.lost.empty())
    promise.delegate(caf::actor_cast<caf::actor>(st.head), std::forward<Ts>(xs)...);
  else if (idempotent && st.away_since)
    st.held.emplace_back(promise, caf::make_message(std::forward<Ts>(xs)...));
  else
    promise.deliver(head_lost(st));
  return promise;
}

/// The held requests go to the head that is back, or get the loss.
void release_held(session_ptr self) {
  auto& st = self->state;
  auto held = std::move(st.held);
  st.held.clear();
  for (auto& [promise, msg] : held) {
    if (st.lost.empty())
      promise.delegate(caf::actor_cast<caf::actor>(st.head), std::move(msg));
    else
      promise.deliver(head_lost(st));
  }
}

caf::behavior session(session_ptr self, head_actor head, session_args args) {
  auto& st = self->state;
  st.head = std::move(head);
  st.args = std::move(args);
  self->monitor(st.head);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (!st.head || dm.source != st.head.address())
      return;
    st.lost = self->system().render(dm.reason);
    st.lost_node = st.head.node();
    st.head = head_actor{};
    runtime::logger("actors.cluster")->error("head_lost endpoint={} reason={} grace_ms={}",
                                             st.args.endpoint, st.lost, st.args.grace.count());
    if (st.args.grace.count() > 0) {
      st.away_since = std::chrono::steady_clock::now();
      self->send(self, reattach_atom::value);
    }
  });
  return {
    [=](cluster_id_atom, const std::string& id) { self->state.cluster_id = id; },
    [=](reattach_atom) {
      auto& st = self->state;
      if (!st.away_since)
        return;
      if (std::chrono::steady_clock::now() - *st.away_since > st.args.grace) {
        st.away_since.reset();
        runtime::logger("actors.cluster")
            ->error("head_not_back endpoint={} grace_ms={}", st.args.endpoint,
                    st.args.grace.count());
        release_held(self);
        return;
      }
      // A new attempt every 300 ms, a few at once: a handshake CAF lets stall (it drops a new
      // connection its heartbeat finds silent only after the connection timeout) does not hold
      // the others back.
      if (st.attempts < 4) {
        ++st.attempts;
        try_attach_again(self->system(), caf::actor_cast<caf::actor>(self), st.args,
                         st.lost_node);
      }
      self->delayed_send(self, std::chrono::milliseconds(300), reattach_atom::value);
    },
    [=](reattach_failed_atom, const std::string& why) {
      --self->state.attempts;
      runtime::logger("actors.cluster")
          ->info("head_still_away endpoint={} error={}", self->state.args.endpoint, why);
    },
    [=](reattached_atom, const caf::actor& head, const std::string& cluster_id) {
      auto& st = self->state;
      --st.attempts;
      if (!st.away_since)
        return;
      st.away_since.reset();
      if (cluster_id != st.cluster_id) {
        st.lost += "; it came back as another cluster (" + cluster_id +
                   "): it restarted without its state file";
        runtime::logger("actors.cluster")
            ->error("head_back_as_another_cluster endpoint={} cluster={} was={}",
                    st.args.endpoint, cluster_id, st.cluster_id);
        release_held(self);
        return;
      }
      st.head = caf::actor_cast<head_actor>(head);
      st.lost.clear();
      self->monitor(st.head);
      runtime::logger("actors.cluster")
          ->warn("head_back endpoint={} cluster={} driver={}", st.args.endpoint, cluster_id,
                 st.args.hello.driver_id);
      release_held(self);
    },
    [=](caf::get_atom) -> caf::result<caf::actor, std::string, std::string> {
      auto& st = self->state;
      if (!st.lost.empty())
        return head_lost(st);
      return {caf::actor_cast<caf::actor>(st.head), st.args.hello.driver_id, st.args.endpoint};
    },
    // Changes fail at once while the head is away (the caller decides whether to do them
    // again); reads wait for it.
    [=](pg_create_atom, const placement_group_request& req) {
      return forward(self, false, pg_create_atom::value, req);
    },
    [=](pg_remove_atom, const std::string& name) {
      return forward(self, false, pg_remove_atom::value, name);
    },
    [=](pg_get_atom, const std::string& name) {
      return forward(self, true, pg_get_atom::value, name);
    },
    [=](pg_table_atom) { return forward(self, true, pg_table_atom::value); },
    [=](reserve_atom, const std::string& group, uint32_t bundle, const resource_amounts& r) {
      return forward(self, false, reserve_atom::value, group, bundle, r);
    },
    [=](release_atom, const std::string& group, uint64_t id) {
      return forward(self, false, release_atom::value, group, id);
    },
    [=](lookup_atom, const std::string& node) {
      return forward(self, true, lookup_atom::value, node);
    },
    [=](cluster_status_atom) { return forward(self, true, cluster_status_atom::value); },
    [=](group_up_atom, const group_record& record) {
      auto& st = self->state;
      if (st.lost.empty())
        self->send(st.head, group_up_atom::value, st.args.hello.driver_id, record);
    },
    [=](group_down_atom, const std::string& name) {
      auto& st = self->state;
      if (st.lost.empty())
        self->send(st.head, group_down_atom::value, st.args.hello.driver_id, name);
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
  session_args args{hello, *at, where, std::chrono::milliseconds{cfg.head_grace_ms}};
  auto s = sys.spawn<caf::hidden>(session, *head, args);
  caf::scoped_actor self{sys};
  caf::error failure;
  self->request(*head, std::chrono::seconds(15), attach_atom::value, hello, s)
    .receive([&](join_reply& r) { self->send(s, cluster_id_atom::value, r.cluster_id); },
             [&](caf::error& err) { failure = std::move(err); });
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
        [&, node = node](std::vector<caf::actor>& got) {
          const auto& idx = by_node[node];
          for (size_t j = 0; j < got.size() && j < idx.size(); ++j)
            ranks[idx[j]] = std::move(got[j]);
          if (got.size() != idx.size() && !failure)
            failure =
                make_error(errc::internal, "group '" + group + "': node '" + node + "' spawned " +
                                               std::to_string(got.size()) + " ranks, asked for " +
                                               std::to_string(idx.size()));
        },
        [&, node = node](caf::error& err) {
          if (!failure)
            failure =
                make_error(errc::rank_failed,
                           "group '" + group + "': node '" + node + "' did not spawn its ranks: " +
                               (error_message(err).empty() ? sys.render(err) : error_message(err)));
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
