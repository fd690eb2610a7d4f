#include "actors/actor_group.hpp"

#include <cmath>
#include <memory>
#include <optional>

#include <caf/all.hpp>

#include "actors/cluster.hpp"
#include "actors/collective_ops.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_actor.hpp"
#include "actors/rendezvous_store.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

constexpr int64_t units_per_gpu = 10000; // the placement library's fixed point

int64_t to_units(double x) {
  return std::llround(x * static_cast<double>(units_per_gpu));
}

double resource_of(const resource_amounts& r, const std::string& name) {
  auto i = r.find(name);
  return i == r.end() ? 0.0 : i->second;
}

// -- the routing actor --------------------------------------------------------------------

/// The rendezvous store's name of a group: unique per driver process (`prefix` is the driver's
/// cluster id, empty in the embedded default) and per routing actor.
std::string store_name_of(const std::string& group, const std::string& prefix, caf::actor_id id) {
  return group + "#" + prefix + std::to_string(id);
}

/// One in-flight group call: results per rank until all arrived or one failed.
struct pending_call {
  caf::atom_value op;
  caf::response_promise promise;
  std::vector<std::optional<caf::message>> results;
  size_t remaining = 0;
  bool done = false;
};

struct group_state {
  std::string group;
  caf::actor manager;                  ///< placement-group manager holding our reservations
  std::string placement_group;
  std::vector<uint64_t> reservations;
  std::string store_name;              ///< in-process rendezvous store, dropped at stop
  caf::actor session;                  ///< the driver's cluster session (cluster mode only)
  std::vector<caf::actor> ranks;
  std::vector<rank_info> infos;
  std::vector<std::string> dead; ///< per rank: empty while alive, else why it died
  std::vector<std::shared_ptr<pending_call>> in_flight;
  static const char* name;
};

const char* group_state::name = "rlforge.actor_group";

std::string rank_prefix(const group_state& st, size_t rank, caf::atom_value op) {
  auto out = "group '" + st.group + "' rank " + std::to_string(rank) + " op '" + op_name(op) + "'";
  // In a cluster the node matters: name it.
  if (st.session && rank < st.infos.size())
    out += " on node '" + st.infos[rank].node_id + "'";
  return out;
}

/// Why a rank is gone, from its down message: a lost connection means its node is gone.
std::string death_reason(caf::actor_system& sys, const caf::error& reason) {
  if (!reason)
    return "exited normally";
  if (reason == caf::exit_reason::remote_link_unreachable)
    return "its node is unreachable: the node process died, hung or lost the network ("
           + sys.render(reason) + ")";
  return sys.render(reason);
}

void fail_call(group_state& st, const std::shared_ptr<pending_call>& call, caf::error err) {
  if (call->done)
    return;
  call->done = true;
  call->promise.deliver(std::move(err));
  auto& v = st.in_flight;
  v.erase(std::remove(v.begin(), v.end(), call), v.end());
}

caf::result<std::vector<caf::message>> start_call(caf::stateful_actor<group_state>* self,
                                                  caf::atom_value op,
                                                  std::vector<caf::message> per_rank,
                                                  int64_t timeout_ms) {
  auto& st = self->state;
  if (timeout_ms <= 0)
    return make_error(errc::invalid_argument, "group '" + st.group + "' op '" + op_name(op) +
                                                  "': timeout must be > 0 ms, got " +
                                                  std::to_string(timeout_ms));
  for (size_t r = 0; r < st.dead.size(); ++r)
    if (!st.dead[r].empty())
      return make_error(errc::rank_failed,
                        rank_prefix(st, r, op) + ": rank is dead (" + st.dead[r] + ")");
  auto call = std::make_shared<pending_call>();
  call->op = op;
  call->promise = self->make_response_promise();
  call->results.resize(st.ranks.size());
  call->remaining = st.ranks.size();
  st.in_flight.push_back(call);
  auto timeout = std::chrono::milliseconds{timeout_ms};
  for (size_t r = 0; r < st.ranks.size(); ++r) {
    self->request(st.ranks[r], timeout,
                  caf::message::concat(caf::make_message(op), std::move(per_rank[r])))
        .then(
            [=](op_result& result) {
              auto& st = self->state;
              if (call->done)
                return;
              call->results[r] = std::move(result.value);
              if (--call->remaining == 0) {
                std::vector<caf::message> out;
                out.reserve(call->results.size());
                for (auto& x : call->results)
                  out.push_back(std::move(*x));
                call->done = true;
                call->promise.deliver(std::move(out));
                auto& v = st.in_flight;
                v.erase(std::remove(v.begin(), v.end(), call), v.end());
              }
            },
            [=](caf::error& err) {
              auto& st = self->state;
              auto prefix = rank_prefix(st, r, op);
              caf::error out;
              if (err == caf::sec::request_timeout)
                out = make_error(errc::timeout, prefix + ": no answer within " +
                                                    std::to_string(timeout_ms) + " ms");
              else if (err == caf::sec::request_receiver_down)
                out =
                    make_error(errc::rank_failed,
                               prefix + ": rank died" +
                                   (st.dead[r].empty() ? std::string{} : " (" + st.dead[r] + ")"));
              else if (err.category() == errc_category && st.session)
                out = make_error(static_cast<errc>(err.code()),
                                 error_message(err) + " (on node '" + st.infos[r].node_id + "')");
              else if (err.category() == errc_category)
                out = err; // the rank already named itself
              else
                out = make_error(errc::rank_failed, prefix + ": " + self->system().render(err));
              fail_call(st, call, std::move(out));
            });
  }
  return call->promise;
}

caf::behavior group_actor(caf::stateful_actor<group_state>* self, std::string name,
                          std::vector<caf::actor> ranks, std::vector<rank_info> infos,
                          caf::actor manager, std::string placement_group,
                          std::vector<uint64_t> reservations, caf::actor session,
                          std::string store_prefix) {
  auto& st = self->state;
  st.session = std::move(session);
  st.manager = std::move(manager);
  st.placement_group = std::move(placement_group);
  st.reservations = std::move(reservations);
  st.store_name = store_name_of(name, store_prefix, self->id());
  st.group = std::move(name);
  st.ranks = std::move(ranks);
  st.infos = std::move(infos);
  st.dead.assign(st.ranks.size(), std::string{});
  for (auto& r : st.ranks)
    self->monitor(r);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t r = 0; r < st.ranks.size(); ++r) {
      if (st.ranks[r].address() != dm.source)
        continue;
      st.dead[r] = death_reason(self->system(), dm.reason);
      runtime::logger("actors.group")->warn("rank_down group={} rank={} reason={}", st.group, r,
                                            st.dead[r]);
      // Every call still waiting on this rank fails now instead of waiting for its deadline.
      auto calls = st.in_flight;
      for (auto& call : calls)
        if (!call->results[r])
          fail_call(st, call, make_error(errc::rank_failed, rank_prefix(st, r, call->op)
                                                              + ": rank died during the call ("
                                                              + st.dead[r] + ")"));
    }
  });
  return {
      [=](all_atom, caf::atom_value op, const caf::message& args,
          int64_t timeout_ms) -> caf::result<std::vector<caf::message>> {
        std::vector<caf::message> per_rank(self->state.ranks.size(), args);
        return start_call(self, op, std::move(per_rank), timeout_ms);
      },
      [=](mesh_atom, caf::atom_value op, std::vector<caf::message>& chunks,
          int64_t timeout_ms) -> caf::result<std::vector<caf::message>> {
        auto& st = self->state;
        if (chunks.size() != st.ranks.size())
          return make_error(errc::invalid_argument,
                            "group '" + st.group + "' op '" + op_name(op) + "': mesh call got " +
                                std::to_string(chunks.size()) + " chunks for " +
                                std::to_string(st.ranks.size()) + " ranks");
        return start_call(self, op, std::move(chunks), timeout_ms);
      },
      [=](ranks_atom) { return self->state.infos; },
      [=](handles_atom) { return self->state.ranks; },
      [=](stop_atom) {
        auto& st = self->state;
        for (auto& r : st.ranks)
          self->send_exit(r, caf::exit_reason::user_shutdown);
        if (st.manager)
          for (auto id : st.reservations)
            self->send(st.manager, release_atom::value, st.placement_group, id);
        release_local_store(st.store_name);
        if (st.session)
          retire_group(st.session, st.group);
        self->quit();
      },
  };
}

/// How the ranks rendezvous: through an in-process store when they share a process (always in
/// the embedded default), else through a store actor spawned here, in the driver's process,
/// which lives as long as the group's routing actor `owner` (no rendezvous port opens).
caf::expected<collective_spec> collective_plan(caf::actor_system& sys,
                                               const std::vector<caf::actor>& ranks,
                                               const caf::actor& owner, const std::string& name,
                                               std::chrono::milliseconds timeout,
                                               bool cluster) {
  collective_spec cs;
  cs.store = "local";
  cs.name = name;
  cs.timeout_ms = timeout.count();
  if (!cluster)
    return cs;
  caf::scoped_actor self{sys};
  std::vector<std::pair<std::string, int64_t>> where;
  caf::error failure;
  for (size_t r = 0; r < ranks.size() && !failure; ++r)
    self->request(ranks[r], timeout, rank_ops::location.call())
        .receive(
            [&](op_result& x) {
              auto at = rank_ops::location.answer(std::move(x.value));
              if (at)
                where.emplace_back(std::get<0>(*at), std::get<1>(*at));
              else
                failure =
                    make_error(errc::internal, "group '" + name + "': rank " + std::to_string(r) +
                                                   ": " + error_message(at.error()));
            },
            [&](caf::error& err) { failure = std::move(err); });
  if (failure)
    return failure;
  bool one_process = std::all_of(where.begin(), where.end(),
                                 [&](const auto& w) { return w == where.front(); });
  if (one_process)
    return cs;
  cs.store = "actor";
  cs.store_actor = spawn_rendezvous_store(sys, owner);
  return cs;
}

} // namespace

caf::expected<std::vector<rank_info>> plan_ranks(const group_spec& spec) {
  auto bad = [&](const std::string& what) {
    return make_error(errc::invalid_argument, "group '" + spec.name + "': " + what);
  };
  if (spec.name.empty())
    return make_error(errc::invalid_argument, "group name must not be empty");
  const auto& bundles = spec.placement.bundles;
  if (bundles.empty())
    return bad("placement group '" + spec.placement.name + "' has no bundles");
  auto num_bundles = static_cast<int32_t>(bundles.size());
  int32_t num_ranks = spec.num_ranks == 0 ? num_bundles : spec.num_ranks;
  if (num_ranks < 0)
    return bad("num_ranks must be >= 0, got " + std::to_string(spec.num_ranks));
  if (num_ranks % num_bundles != 0)
    return bad("num_ranks " + std::to_string(num_ranks) + " is not a multiple of the "
               + std::to_string(num_bundles) + " bundles");
  if (spec.threads_per_rank < 0)
    return bad("threads_per_rank must be >= 0, got " + std::to_string(spec.threads_per_rank));
  if (!std::isfinite(spec.gpu_per_rank) || spec.gpu_per_rank < 0)
    return bad("gpu_per_rank must be a finite number >= 0, got "
               + std::to_string(spec.gpu_per_rank));
  if (spec.init_timeout.count() <= 0)
    return bad("init_timeout must be > 0 ms, got " + std::to_string(spec.init_timeout.count()));
  int32_t per_bundle = num_ranks / num_bundles;
  std::vector<rank_info> out;
  out.reserve(num_ranks);
  for (int32_t r = 0; r < num_ranks; ++r) {
    const auto& b = bundles[r / per_bundle];
    double bundle_gpu = resource_of(b.resources, "GPU");
    double share = spec.gpu_per_rank > 0 ? spec.gpu_per_rank : bundle_gpu / per_bundle;
    // Exact fixed-point accounting: per_bundle shares must fit the bundle's GPU.
    if (to_units(share) * per_bundle > to_units(bundle_gpu))
      return bad(std::to_string(per_bundle) + " ranks x GPU " + std::to_string(share)
                 + " do not fit bundle " + std::to_string(b.bundle_index) + " (GPU "
                 + std::to_string(bundle_gpu) + ")");
    int32_t threads = spec.threads_per_rank;
    if (threads == 0) {
      auto cpus = static_cast<int32_t>(resource_of(b.resources, "CPU"));
      threads = std::max(1, cpus / per_bundle);
    }
    rank_info info;
    info.group = spec.name;
    info.rank = r;
    info.world_size = num_ranks;
    info.node_id = b.node_id;
    info.device_ids = b.device_ids;
    info.gpu_fraction = share;
    info.threads = threads;
    info.virtual_gpu = true;
    out.push_back(std::move(info));
  }
  return out;
}

caf::expected<caf::actor> spawn_actor_group(caf::actor_system& sys, const group_spec& spec) {
  const auto spawn_start = std::chrono::steady_clock::now();
  auto plan = plan_ranks(spec);
  if (!plan)
    return std::move(plan.error());
  std::vector<caf::actor> ranks;
  std::vector<uint64_t> reservations;
  auto release_all = [&] {
    caf::scoped_actor self{sys};
    for (auto id : reservations)
      self->send(spec.placement_manager, release_atom::value, spec.placement.name, id);
    reservations.clear();
  };
  auto stop_all = [&] {
    for (auto& r : ranks)
      caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
    release_all();
  };
  if (spec.placement_manager) {
    // Reserve every rank's GPU share in its bundle first, so a group that does not fit next to
    // the groups already sharing the bundle fails before anything is spawned.
    caf::scoped_actor self{sys};
    for (auto& info : *plan) {
      if (info.gpu_fraction <= 0)
        continue;
      const auto& b = spec.placement.bundles[info.rank / (plan->size() / spec.placement.bundles.size())];
      caf::error failure;
      self->request(spec.placement_manager, std::chrono::seconds(30), reserve_atom::value,
                    spec.placement.name, b.bundle_index, resource_amounts{{"GPU", info.gpu_fraction}})
        .receive([&](uint64_t id) { reservations.push_back(id); },
                 [&](caf::error& e) { failure = std::move(e); });
      if (failure) {
        release_all();
        return make_error(errc::invalid_argument,
                          "group '" + spec.name + "': rank " + std::to_string(info.rank)
                            + " cannot take GPU " + std::to_string(info.gpu_fraction)
                            + " of bundle " + std::to_string(b.bundle_index) + ": "
                            + (error_message(failure).empty() ? sys.render(failure)
                                                              : error_message(failure)));
      }
    }
  }
  auto cluster = cluster_session(sys);
  if (!cluster) {
    release_all();
    return make_error(errc::io_error,
                      "group '" + spec.name + "': " + (error_message(cluster.error()).empty()
                                                         ? sys.render(cluster.error())
                                                         : error_message(cluster.error())));
  }
  if (*cluster) {
    // A cluster: each node's agent spawns the ranks placed on it.
    auto remote = spawn_cluster_ranks(sys, **cluster, spec.kind, *plan,
                                      spec.init_timeout + std::chrono::seconds(10));
    if (!remote) {
      release_all();
      return std::move(remote.error());
    }
    ranks = std::move(*remote);
  } else {
    for (auto& info : *plan) {
      auto r = spawn_rank(sys, spec.kind, info);
      if (!r) {
        stop_all();
        return make_error(errc::invalid_argument,
                          "group '" + spec.name + "': cannot spawn rank "
                            + std::to_string(info.rank) + ": " + sys.render(r.error()));
      }
      ranks.push_back(std::move(*r));
    }
  }
  caf::actor session = *cluster ? (*cluster)->session : caf::actor{};
  auto prefix = *cluster ? (*cluster)->driver_id + "#" : std::string{};
  auto group = sys.spawn(group_actor, spec.name, ranks, *plan, spec.placement_manager,
                         spec.placement.name, reservations, session, prefix);
  if (spec.collectives) {
    actor_group handle{sys, group};
    auto cs = collective_plan(sys, ranks, group, store_name_of(spec.name, prefix, group.id()),
                              spec.init_timeout, static_cast<bool>(session));
    if (!cs) {
      handle.stop();
      return std::move(cs.error());
    }
    // Ranks rendezvous concurrently; the call's deadline is the rendezvous timeout plus slack
    // for thread start-up.
    auto res = handle.call_all(rank_ops::init_collective,
                               spec.init_timeout + std::chrono::seconds(5), *cs);
    if (!res) {
      handle.stop();
      return std::move(res.error());
    }
  }
  if (session) {
    group_record record{spec.name, spec.kind, spec.placement.name, {}};
    for (auto& info : *plan)
      record.rank_nodes.push_back(info.node_id);
    record.spawn_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - spawn_start).count();
    announce_group(session, record);
  }
  return group;
}

// -- driver-side handle -----------------------------------------------------------------------

actor_group::actor_group(caf::actor_system& sys, caf::actor group)
  : sys_(&sys), group_(std::move(group)) {
}

caf::expected<actor_group> actor_group::spawn(caf::actor_system& sys, const group_spec& spec) {
  auto g = spawn_actor_group(sys, spec);
  if (!g)
    return std::move(g.error());
  return actor_group{sys, std::move(*g)};
}

namespace {

/// A blocking request with a deadline; the group answers within its own per-rank deadline, so
/// the outer one only guards against a dead routing actor.
template <class T, class... Ts>
caf::expected<T> blocking_request(caf::actor_system& sys, const caf::actor& dest,
                                  std::chrono::milliseconds timeout, Ts&&... xs) {
  if (!dest)
    return make_error(errc::invalid_argument, "request to an invalid (stopped) group handle");
  caf::scoped_actor self{sys};
  caf::expected<T> out{caf::error{}};
  self->request(dest, timeout, std::forward<Ts>(xs)...)
    .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace

caf::expected<std::vector<caf::message>> actor_group::call_all(caf::atom_value op,
                                                               const caf::message& args,
                                                               std::chrono::milliseconds timeout) {
  return blocking_request<std::vector<caf::message>>(*sys_, group_,
                                                     timeout + std::chrono::seconds(1),
                                                     all_atom::value, op, args,
                                                     static_cast<int64_t>(timeout.count()));
}

caf::expected<std::vector<caf::message>> actor_group::call_mesh(caf::atom_value op,
                                                                std::vector<caf::message> chunks,
                                                                std::chrono::milliseconds timeout) {
  return blocking_request<std::vector<caf::message>>(*sys_, group_,
                                                     timeout + std::chrono::seconds(1),
                                                     mesh_atom::value, op, std::move(chunks),
                                                     static_cast<int64_t>(timeout.count()));
}

caf::expected<std::vector<rank_info>> actor_group::ranks() {
  return blocking_request<std::vector<rank_info>>(*sys_, group_, std::chrono::seconds(10),
                                                  ranks_atom::value);
}

caf::expected<std::vector<caf::actor>> actor_group::rank_handles() {
  return blocking_request<std::vector<caf::actor>>(*sys_, group_, std::chrono::seconds(10),
                                                   handles_atom::value);
}

void actor_group::stop() {
  if (group_) {
    caf::anon_send(group_, stop_atom::value);
    group_ = caf::actor{};
  }
}

} // namespace rlforge::actors
