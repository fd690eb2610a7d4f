#include "actors/node_agent.hpp"

#include <unistd.h>

#include <map>
#include <optional>

#include <caf/all.hpp>

#include "actors/actor_kind.hpp"
#include "actors/local_exit.hpp"
#include "actors/rank_actor.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

/// The ranks one driver owns on this node.
struct owner_entry {
  caf::actor owner;
  std::string id;
  std::vector<caf::actor> ranks;
};

struct agent_state {
  node_agent_options opts;
  uint16_t port = 0; ///< where the agent is published
  head_actor head;
  std::string cluster_id;
  std::chrono::milliseconds heartbeat{200};
  bool ticking = false;
  /// When the head was lost and why, while the ranks wait for it (head_grace).
  std::optional<std::chrono::steady_clock::time_point> head_lost_at;
  std::string head_lost_why;
  std::map<caf::actor_addr, owner_entry> owners;
  static const char* name;
};

const char* agent_state::name = "rlforge.node_agent";

using agent_ptr = node_agent_actor::stateful_pointer<agent_state>;

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

const std::string& node_id(agent_ptr self) {
  return self->state.opts.resources.node_id;
}

void stop_ranks(agent_ptr self, owner_entry& e) {
  for (auto& r : e.ranks)
    self->send_exit(r, caf::exit_reason::user_shutdown);
  e.ranks.clear();
}

void stop_all(agent_ptr self, const std::string& why) {
  auto& st = self->state;
  size_t n = 0;
  for (auto& [_, e] : st.owners) {
    n += e.ranks.size();
    stop_ranks(self, e);
    self->demonitor(e.owner.address());
  }
  st.owners.clear();
  if (n > 0)
    runtime::logger("actors.node")->warn("stop_ranks node={} ranks={} reason={}", node_id(self), n,
                                         why);
}

node_heartbeat census(const agent_state& st) {
  node_heartbeat hb;
  hb.node_id = st.opts.resources.node_id;
  for (auto& [_, e] : st.owners) {
    hb.owners.push_back(e.id);
    hb.ranks.push_back(static_cast<int32_t>(e.ranks.size()));
  }
  return hb;
}

node_join_request join_request(agent_ptr self) {
  auto& st = self->state;
  node_join_request req;
  req.resources = st.opts.resources;
  req.address = st.opts.address;
  req.port = st.port;
  req.version = rlforge_version();
  req.wire_types = wire_signature(self->system());
  req.kinds = kind_interfaces();
  req.host = host_name();
  req.pid = static_cast<int64_t>(::getpid());
  return req;
}

/// Joins `head`; `k` gets the head's reply or its refusal.
template <class K>
void join(agent_ptr self, head_actor head, K k) {
  auto& st = self->state;
  self->request(head, st.opts.join_timeout, join_atom::value, join_request(self),
                caf::actor_cast<node_agent_actor>(self))
    .then(
      [=](join_reply& reply) mutable {
        auto& st = self->state;
        st.head = head;
        if (!st.cluster_id.empty() && reply.cluster_id != st.cluster_id)
          stop_all(self, "the head came back as another cluster (" + reply.cluster_id +
                           ", was " + st.cluster_id + "): it restarted without its state file");
        else if (st.head_lost_at && !st.owners.empty())
          runtime::logger("actors.node")
              ->warn("ranks_kept node={} cluster={} reason=the head is back", node_id(self),
                     reply.cluster_id);
        st.head_lost_at.reset();
        st.cluster_id = reply.cluster_id;
        st.heartbeat = std::chrono::milliseconds{std::max<int64_t>(10, reply.heartbeat_ms)};
        self->monitor(head);
        runtime::logger("actors.node")->info("joined node={} cluster={}", node_id(self),
                                             reply.cluster_id);
        if (!st.ticking) {
          st.ticking = true;
          self->send(self, cluster_tick_atom::value);
        }
        k(std::move(reply));
      },
      [=](caf::error& err) mutable { k(std::move(err)); });
}

node_agent_actor::behavior_type agent(agent_ptr self, node_agent_options opts) {
  self->state.opts = std::move(opts);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.head && dm.source == st.head.address()) {
      st.head = head_actor{};
      const auto why = "the head is gone (" + self->system().render(dm.reason) + ")";
      if (st.opts.head_grace.count() == 0) {
        stop_all(self, why);
        return;
      }
      st.head_lost_at = std::chrono::steady_clock::now();
      st.head_lost_why = why;
      if (!st.owners.empty())
        runtime::logger("actors.node")
            ->warn("ranks_wait node={} grace_ms={} reason={}", node_id(self),
                   st.opts.head_grace.count(), why);
      return;
    }
    if (auto i = st.owners.find(dm.source); i != st.owners.end()) {
      runtime::logger("actors.node")->info("owner_gone node={} owner={} ranks={}", node_id(self),
                                           i->second.id, i->second.ranks.size());
      stop_ranks(self, i->second);
      st.owners.erase(i);
      return;
    }
    for (auto i = st.owners.begin(); i != st.owners.end(); ++i) {
      auto& ranks = i->second.ranks;
      auto before = ranks.size();
      ranks.erase(std::remove_if(ranks.begin(), ranks.end(),
                                 [&](const caf::actor& r) { return r.address() == dm.source; }),
                  ranks.end());
      if (ranks.size() != before) {
        if (ranks.empty()) {
          self->demonitor(i->second.owner.address());
          st.owners.erase(i);
        }
        return;
      }
    }
  });
  self->set_exit_handler([=](caf::exit_msg& msg) {
    // Only this process may stop its agent: a remote exit (a confused or hostile peer) is
    // dropped.
    if (!local_exit(msg.source, self->address())) {
      runtime::logger("actors.node")->warn("ignored_remote_exit node={}", node_id(self));
      return;
    }
    stop_all(self, "the node agent stops");
    self->quit(msg.reason);
  });
  return {
      [=](spawn_ranks_atom, const std::string& kind, const std::vector<rank_info>& infos,
          const caf::actor& owner,
          const std::string& owner_id) -> caf::result<std::vector<caf::actor>> {
        auto& st = self->state;
        auto where = "node '" + node_id(self) + "': spawn of " + std::to_string(infos.size()) +
                     " rank(s) of kind '" + kind + "'";
        if (!st.head)
          return make_error(errc::unsupported,
                            where + ": the node is not part of a cluster right now (it lost its "
                                    "head and is joining again); retry");
        if (!owner)
          return make_error(errc::invalid_argument, where + ": no owner given");
        if (infos.empty())
          return make_error(errc::invalid_argument, where + ": no ranks given");
        if (auto k = find_kind(kind); !k)
          return make_error(errc::not_found, where + ": " + error_message(k.error()));
        for (auto& info : infos)
          if (info.node_id != node_id(self))
            return make_error(errc::invalid_argument,
                              where + ": rank " + std::to_string(info.rank) + " of group '" +
                                  info.group + "' is placed on node '" + info.node_id + "'");
        std::vector<caf::actor> spawned;
        for (auto& info : infos) {
          auto r = spawn_rank(self->system(), kind, info);
          if (!r) {
            for (auto& x : spawned)
              self->send_exit(x, caf::exit_reason::user_shutdown);
            return make_error(errc::invalid_argument,
                              where + ": rank " + std::to_string(info.rank) + " of group '" +
                                  info.group + "': " + self->system().render(r.error()));
          }
          spawned.push_back(std::move(*r));
        }
        auto& entry = st.owners[owner.address()];
        if (!entry.owner) {
          entry.owner = owner;
          entry.id = owner_id;
          self->monitor(owner);
        }
        for (auto& r : spawned) {
          self->monitor(r);
          entry.ranks.push_back(r);
        }
        return spawned;
      },
      [=](census_atom) { return census(self->state); },
      [=](use_head_atom, const caf::actor& head, uint16_t port) -> caf::result<join_reply> {
        auto sender = self->current_sender();
        if (!sender || sender->node() != self->node())
          return make_error(errc::invalid_argument,
                            "node '" + node_id(self) + "': only its own process picks its head");
        if (!head)
          return make_error(errc::invalid_argument, "node '" + node_id(self) + "': invalid head");
        auto& st = self->state;
        st.port = port;
        if (st.head) {
          self->demonitor(st.head.address());
          st.head = head_actor{};
        }
        auto promise = self->make_response_promise<join_reply>();
        join(self, caf::actor_cast<head_actor>(head), [=](caf::expected<join_reply> r) mutable {
          if (r)
            promise.deliver(std::move(*r));
          else
            promise.deliver(std::move(r.error()));
        });
        return promise;
      },
      [=](leave_atom, const std::string& reason) {
        auto& st = self->state;
        auto sender = self->current_sender();
        if (!st.head || !sender || sender->address() != st.head.address())
          return; // only the head expels
        auto head = st.head;
        self->demonitor(head.address());
        st.head = head_actor{};
        stop_all(self, "the head declared the node dead: " + reason);
        join(self, head, [=](caf::expected<join_reply> r) {
          if (!r)
            runtime::logger("actors.node")
                ->error("rejoin_failed node={} error={}", node_id(self),
                        self->system().render(r.error()));
        });
      },
      [=](cluster_tick_atom) {
        auto& st = self->state;
        if (st.head)
          self->send(st.head, heartbeat_atom::value, census(st));
        if (st.head_lost_at &&
            std::chrono::steady_clock::now() - *st.head_lost_at > st.opts.head_grace) {
          stop_all(self, st.head_lost_why + " and not back within " +
                             std::to_string(st.opts.head_grace.count()) + " ms");
          st.head_lost_at.reset();
        }
        self->delayed_send(self, st.heartbeat, cluster_tick_atom::value);
      },
  };
}

} // namespace

node_agent_actor spawn_node_agent(caf::actor_system& sys, node_agent_options opts) {
  return sys.spawn(agent, std::move(opts));
}

} // namespace rlforge::actors
