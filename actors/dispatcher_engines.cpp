// The dispatcher's engine calls (dispatcher_state.hpp): placement of generate, submit and
// cancel on engine ranks, streamed results, engine deaths.
#include "actors/dispatcher_state.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/batch_wire.hpp"
#include "actors/protocol.hpp"
#include "actors/rendezvous_store.hpp"
#include "actors/weight_sync.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors::dispatch {

// -- engines -----------------------------------------------------------------------------------

caf::error check_generate_args(const std::string& role, caf::atom_value op,
                               const caf::message& args) {
  if (!args.match_elements<std::vector<sample_request>>())
    return make_error(errc::invalid_argument, prefix(role, op) +
                                                  ": expects (std::vector<sample_request>), got " +
                                                  caf::to_string(args));
  const auto& requests = args.get_as<std::vector<sample_request>>(0);
  if (requests.empty())
    return make_error(errc::invalid_argument, prefix(role, op) + ": no requests");
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    auto where = prefix(role, op) + ": request " + std::to_string(i) + ": ";
    if (r.prompt.empty())
      return make_error(errc::invalid_argument, where + "empty prompt");
    if (r.max_tokens <= 0)
      return make_error(errc::invalid_argument,
                        where + "max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
    if (r.num_samples < 1)
      return make_error(errc::invalid_argument,
                        where + "num_samples must be >= 1, got " + std::to_string(r.num_samples));
  }
  return caf::error{};
}

namespace {

std::string index_list(const std::vector<size_t>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size() && i < 8; ++i)
    out += (i ? ", " : "") + std::to_string(xs[i]);
  if (xs.size() > 8)
    out += ", ...";
  return out;
}


/// Records engine ranks `gone` of `role` as dead (their actors are gone though their down
/// message has not arrived yet); true when there were any.
bool mark_gone(self_ptr self, const std::string& role, const std::vector<size_t>& gone) {
  auto* e = find_role(self, role);
  if (!e || gone.empty())
    return false;
  if (e->dead.size() != e->ranks.size())
    e->dead.assign(e->ranks.size(), "");
  for (auto j : gone)
    if (j < e->dead.size() && e->dead[j].empty())
      e->dead[j] = "died (its actor is gone)";
  return true;
}


/// The engine rank of each request: `spread_over_live` over `e`'s live ranks after sizing its
/// load vector (`added` gets each rank's share of the cost); an error when the group has no
/// ranks or none is alive.
caf::expected<std::vector<size_t>> place_requests(role_entry& e, const std::string& role,
                                                  caf::atom_value op,
                                                  const std::vector<sample_request>& requests,
                                                  std::vector<int64_t>& added) {
  const size_t n = e.ranks.size();
  if (n == 0)
    return make_error(errc::internal, prefix(role, op) + ": the engine group has no ranks");
  if (e.load.size() != n)
    e.load.assign(n, 0);
  added.assign(n, 0);
  auto owner = spread_over_live(e, requests, added);
  if (owner.empty())
    return no_live_engine(e, role, op);
  return owner;
}

} // namespace

void generate_call(self_ptr self, const std::string& role, caf::atom_value op,
                   const caf::message& args, int64_t timeout_ms, reply_fn k) {
  auto* e = find_role(self, role);
  if (!e)
    return k(role_gone(role, op));
  const auto& requests = args.get_as<std::vector<sample_request>>(0);
  std::vector<int64_t> extra;
  auto placed = place_requests(*e, role, op, requests, extra);
  if (!placed)
    return k(std::move(placed.error()));
  const auto owner = std::move(*placed);
  const size_t n = e->ranks.size();
  std::vector<std::vector<size_t>> assigned(n);
  std::vector<size_t> offset(requests.size());
  std::vector<size_t> rows(n, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    assigned[owner[i]].push_back(i);
    offset[i] = rows[owner[i]];
    rows[owner[i]] += static_cast<size_t>(requests[i].num_samples);
  }
  for (size_t j = 0; j < n; ++j)
    e->load[j] += extra[j];
  struct gather {
    std::vector<std::vector<sample_output>> parts;
    size_t pending = 0;
    caf::error error;
    size_t failed = 0;
    std::vector<size_t> gone; ///< ranks that died before or while running their share
  };
  auto g = std::make_shared<gather>();
  g->parts.resize(n);
  for (size_t j = 0; j < n; ++j)
    if (!assigned[j].empty())
      ++g->pending;
  auto finish = [=] {
    if (auto* e2 = find_role(self, role); e2 && e2->load.size() == n)
      for (size_t j = 0; j < n; ++j)
        e2->load[j] -= extra[j];
    // Shares lost only because their ranks died go again, all of the call, to the live ranks
    // (seeded samples repeat their tokens).
    if (g->error && g->failed == g->gone.size() && mark_gone(self, role, g->gone))
      return generate_call(self, role, op, args, timeout_ms, k);
    if (g->error)
      return k(std::move(g->error));
    std::vector<sample_output> out;
    for (size_t i = 0; i < requests.size(); ++i)
      for (int64_t s = 0; s < requests[i].num_samples; ++s)
        out.push_back(std::move(g->parts[owner[i]][offset[i] + static_cast<size_t>(s)]));
    k(op_result{caf::make_message(std::move(out))});
  };
  for (size_t j = 0; j < n; ++j) {
    if (assigned[j].empty())
      continue;
    std::vector<sample_request> share;
    for (auto i : assigned[j])
      share.push_back(requests[i]);
    auto context = prefix(role, op) + ": engine rank " + std::to_string(j) + " (requests " +
                   index_list(assigned[j]) + " of the call)";
    // Settled once: by the rank's answer, or by its death (rank_call).
    auto settle = [=](caf::expected<caf::message> r) {
      if (!r) {
        ++g->failed;
        if (r.error() == caf::sec::request_receiver_down)
          g->gone.push_back(j);
        if (!g->error)
          g->error = with_context(self, context, r.error(), timeout_ms);
      } else if (!r->match_elements<std::vector<sample_output>>() ||
                 r->get_as<std::vector<sample_output>>(0).size() != rows[j]) {
        if (!g->error)
          g->error = make_error(errc::internal, context + ": answered " +
                                                    caf::to_string(*r) + ", expected " +
                                                    std::to_string(rows[j]) + " rows");
      } else {
        g->parts[j] = std::move(r->get_mutable_as<std::vector<sample_output>>(0));
      }
      if (--g->pending == 0)
        finish();
    };
    rank_call(self, e->ranks[j], op, caf::make_message(std::move(share)), timeout_ms, settle);
  }
}

/// The streaming `submit` of one engine role: (consumer, ids, requests).
caf::error check_submit_args(const std::string& role, caf::atom_value op,
                             const caf::message& args) {
  if (!args.match_elements<caf::actor, std::vector<int64_t>, std::vector<sample_request>>())
    return make_error(errc::invalid_argument,
                      prefix(role, op) +
                          ": expects (caf::actor consumer, std::vector<int64_t> ids, "
                          "std::vector<sample_request>), got " +
                          caf::to_string(args));
  if (!args.get_as<caf::actor>(0))
    return make_error(errc::invalid_argument, prefix(role, op) + ": the consumer is invalid");
  const auto& ids = args.get_as<std::vector<int64_t>>(1);
  const auto& requests = args.get_as<std::vector<sample_request>>(2);
  if (ids.size() != requests.size())
    return make_error(errc::invalid_argument, prefix(role, op) + ": " +
                                                  std::to_string(ids.size()) + " ids for " +
                                                  std::to_string(requests.size()) + " requests");
  return check_generate_args(role, op, caf::make_message(requests));
}

/// Spreads a submission over the role's engine ranks (least loaded first), each rank sending
/// its results back here to be forwarded; answers the engine rank of each request. A refusal by
/// any rank refuses the whole submission (what other ranks accepted is cancelled).
void submit_call(self_ptr self, const std::string& role, caf::atom_value op,
                 const caf::message& args, int64_t timeout_ms, reply_fn k) {
  auto* e = find_role(self, role);
  if (!e)
    return k(role_gone(role, op));
  const auto consumer = args.get_as<caf::actor>(0);
  const auto& ids = args.get_as<std::vector<int64_t>>(1);
  const auto& requests = args.get_as<std::vector<sample_request>>(2);
  std::vector<int64_t> extra; // unused: each request's cost is added to the load below
  auto placed = place_requests(*e, role, op, requests, extra);
  if (!placed)
    return k(std::move(placed.error()));
  const auto owner = std::move(*placed);
  const size_t n = e->ranks.size();
  std::vector<std::vector<int64_t>> share_ids(n);
  std::vector<std::vector<sample_request>> shares(n);
  auto& st = self->state;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto id = st.next_stream++;
    const auto& r = requests[i];
    const int64_t cost = std::max<int64_t>(1, r.num_samples) *
                         (static_cast<int64_t>(r.prompt.size()) + std::max<int64_t>(0, r.max_tokens));
    st.streams[id] = stream_entry{consumer, ids[i], role, owner[i], cost};
    e->load[owner[i]] += cost;
    share_ids[owner[i]].push_back(id);
    shares[owner[i]].push_back(r);
  }
  struct gather {
    size_t pending = 0;
    caf::error error;
    std::vector<size_t> accepted;
    std::vector<size_t> gone; ///< ranks that died before the dispatcher heard of it
    size_t calls = 0;         ///< ranks given a share
  };
  auto g = std::make_shared<gather>();
  for (size_t j = 0; j < n; ++j)
    if (!shares[j].empty())
      ++g->pending;
  g->calls = g->pending;
  std::vector<int32_t> ranks(owner.begin(), owner.end());
  auto forget = [self](const std::vector<int64_t>& sids) {
    for (auto id : sids) {
      auto i = self->state.streams.find(id);
      if (i == self->state.streams.end())
        continue;
      if (auto* r = find_role(self, i->second.role); r && i->second.rank < r->load.size())
        r->load[i->second.rank] -= i->second.cost;
      self->state.streams.erase(i);
    }
  };
  for (size_t j = 0; j < n; ++j) {
    if (shares[j].empty())
      continue;
    auto context = prefix(role, op) + ": engine rank " + std::to_string(j);
    auto sids = share_ids[j];
    rank_call(self, e->ranks[j], op,
              caf::make_message(caf::actor_cast<caf::actor>(self), sids, std::move(shares[j]),
                                timeout_ms),
              timeout_ms, [=](caf::expected<caf::message> r) {
                if (r) {
                  g->accepted.push_back(j);
                } else {
                  forget(sids);
                  if (r.error() == caf::sec::request_receiver_down)
                    g->gone.push_back(j);
                  if (!g->error)
                    g->error = with_context(self, context, r.error(), timeout_ms);
                }
                if (--g->pending > 0)
                  return;
                if (!g->error)
                  return k(op_result{caf::make_message(ranks)});
                // A rank that died before its down message arrived: mark it and submit the
                // whole call again to the live ranks (what the others accepted is stopped
                // below), unless another rank refused it for a reason of its own.
                const bool only_gone = g->gone.size() + g->accepted.size() == g->calls;
                // All or nothing: what other ranks accepted is stopped and forgotten.
                for (auto a : g->accepted) {
                  if (auto* e2 = find_role(self, role); e2 && a < e2->ranks.size())
                    if (auto cancel = op_routed(*e2, role, op_route::cancel_streams))
                      rank_call(self, e2->ranks[a], *cancel,
                                caf::make_message(caf::actor_cast<caf::actor>(self),
                                                  share_ids[a]),
                                timeout_ms, [](caf::expected<caf::message>) {});
                  forget(share_ids[a]);
                }
                if (only_gone && mark_gone(self, role, g->gone))
                  return submit_call(self, role, op, args, timeout_ms, k);
                k(std::move(g->error));
              });
  }
}

/// Stops requests of `consumer` submitted through the dispatcher: (consumer, ids) → int64.
void cancel_call(self_ptr self, const std::string& role, caf::atom_value op,
                 const caf::message& args, int64_t timeout_ms, reply_fn k) {
  if (!args.match_elements<caf::actor, std::vector<int64_t>>())
    return k(make_error(errc::invalid_argument,
                        prefix(role, op) + ": expects (caf::actor consumer, std::vector<int64_t> "
                                           "ids), got " +
                            caf::to_string(args)));
  auto* e = find_role(self, role);
  if (!e)
    return k(role_gone(role, op));
  const auto consumer = args.get_as<caf::actor>(0);
  std::set<int64_t> wanted(args.get_as<std::vector<int64_t>>(1).begin(),
                           args.get_as<std::vector<int64_t>>(1).end());
  std::map<size_t, std::vector<int64_t>> by_rank;
  for (auto& [id, s] : self->state.streams)
    if (s.role == role && s.consumer == consumer && wanted.count(s.user_id))
      by_rank[s.rank].push_back(id);
  if (by_rank.empty())
    return k(op_result{caf::make_message(int64_t{0})});
  auto pending = std::make_shared<size_t>(by_rank.size());
  auto total = std::make_shared<int64_t>(0);
  auto failed = std::make_shared<caf::error>();
  for (auto& [rank, sids] : by_rank) {
    auto context = prefix(role, op) + ": engine rank " + std::to_string(rank);
    rank_call(self, e->ranks[rank], op,
              caf::make_message(caf::actor_cast<caf::actor>(self), sids), timeout_ms,
              [=](caf::expected<caf::message> r) {
                if (r && r->match_elements<int64_t>())
                  *total += r->get_as<int64_t>(0);
                else if (!r && !*failed)
                  *failed = with_context(self, context, r.error(), timeout_ms);
                if (--*pending > 0)
                  return;
                if (*failed)
                  return k(std::move(*failed));
                k(op_result{caf::make_message(*total)});
              });
  }
}

/// An engine's result for a request submitted through the dispatcher: forwarded to its
/// consumer under the consumer's id.
void forward_result(self_ptr self, generation_result& r) {
  auto i = self->state.streams.find(r.id);
  if (i == self->state.streams.end())
    return; // cancelled as part of a refused submission
  auto s = std::move(i->second);
  self->state.streams.erase(i);
  if (auto* e = find_role(self, s.role); e && s.rank < e->load.size())
    e->load[s.rank] -= s.cost;
  r.id = s.user_id;
  self->send(s.consumer, std::move(r));
}

/// An engine rank died: every request submitted through the dispatcher that it was running is
/// reported lost to its consumer (error_code rank_failed, no rows), so the consumer requeues it.
void engine_down(self_ptr self, const caf::actor_addr& who, const caf::error& reason) {
  for (auto& [name, e] : self->state.roles) {
    if (!e.engine)
      continue;
    for (size_t rank = 0; rank < e.ranks.size(); ++rank) {
      if (e.ranks[rank].address() != who)
        continue;
      const auto why = "engine rank " + std::to_string(rank) + " of role '" + name +
                       "' died (" + self->system().render(reason) +
                       ") while running the request; it was lost: requeue it";
      for (auto i = self->state.streams.begin(); i != self->state.streams.end();) {
        if (i->second.role != name || i->second.rank != rank) {
          ++i;
          continue;
        }
        generation_result lost;
        lost.id = i->second.user_id;
        lost.error = why;
        lost.error_code = static_cast<int32_t>(errc::rank_failed);
        lost.engine_rank = static_cast<int32_t>(rank);
        self->send(i->second.consumer, std::move(lost));
        i = self->state.streams.erase(i);
      }
      if (rank < e.load.size())
        e.load[rank] = 0;
      if (e.dead.size() != e.ranks.size())
        e.dead.assign(e.ranks.size(), "");
      e.dead[rank] = "died (" + self->system().render(reason) + ")";
      runtime::logger("actors.dispatch")->warn("engine_down role={} rank={}", name, rank);
    }
  }
  // Calls still waiting for the dead rank fail now (and go again to the live ranks).
  if (auto w = self->state.rank_watchers.find(who); w != self->state.rank_watchers.end()) {
    auto watchers = std::move(w->second);
    self->state.rank_watchers.erase(w);
    const auto why = "declared dead: " + self->system().render(reason);
    for (auto& [id, fire] : watchers)
      fire(why);
  }
}

} // namespace rlforge::actors::dispatch
