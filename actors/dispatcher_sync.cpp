// The dispatcher's weight sync (dispatcher_state.hpp): versions, pauses, residency,
// transports and Gloo channels of `save_weights_for_sampler`.
#include "actors/dispatcher_state.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/batch_wire.hpp"
#include "actors/engine.hpp"
#include "actors/protocol.hpp"
#include "actors/rendezvous_store.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors::dispatch {

// -- weight sync -------------------------------------------------------------------------------

std::vector<std::string> engine_roles(self_ptr self) {
  std::vector<std::string> out;
  for (auto& [name, e] : self->state.roles)
    if (e.engine)
      out.push_back(name);
  return out;
}

namespace {

/// Transfers `source`'s weights to every rank of every engine role as `version`.
step transfer_step(self_ptr self, const std::string& source, std::shared_ptr<int64_t> version,
                   int64_t timeout_ms) {
  return [=](done_fn done) {
    const auto op = dispatcher_ops::sync_weights.id;
    auto& st = self->state;
    auto* src = find_role(self, source);
    if (!src)
      return done(role_gone(source, op));
    auto from = src->where.empty() ? this_process() : src->where[0];
    struct receiver {
      caf::actor rank;
      std::string role;
      size_t index;
      weight_sync_spec spec;
    };
    std::vector<receiver> receivers;
    std::vector<size_t> gloo;
    auto base = new_sync_channel();
    for (auto& name : engine_roles(self)) {
      auto& e = st.roles.at(name);
      for (size_t r = 0; r < e.ranks.size(); ++r) {
        if (!e.alive(r))
          continue; // a dead rank keeps nothing; the live ones get the weights
        weight_sync_spec spec;
        spec.transport = st.transport != "auto" ? st.transport
                         : r < e.where.size()   ? choose_transport(from, e.where[r])
                                                : std::string{"in_process"};
        spec.channel = base + "-" + std::to_string(receivers.size());
        spec.version = *version;
        spec.timeout_ms = timeout_ms;
        if (spec.transport == "gloo")
          gloo.push_back(receivers.size());
        receivers.push_back({e.ranks[r], name, r, std::move(spec)});
      }
    }
    if (receivers.empty()) {
      for (auto& name : engine_roles(self))
        if (!st.roles.at(name).dead.empty())
          return done(no_live_engine(st.roles.at(name), name, op));
      return done(
          make_error(errc::not_found, prefix(source, op) + ": the engine groups have no ranks"));
    }
    st.last_sync.clear();
    for (auto& r : receivers)
      st.last_sync[r.role + "/" + std::to_string(r.index)] = r.spec.transport;
    const bool uses_gloo = !gloo.empty();
    auto launch = [=](std::vector<receiver> rs) {
      std::vector<weight_sync_spec> sends;
      bool gloo_sent = false;
      for (auto& r : rs) {
        if (r.spec.transport != "gloo") {
          sends.push_back(r.spec);
        } else if (!gloo_sent) {
          auto s = r.spec;
          s.rank = 0;
          sends.push_back(s);
          gloo_sent = true;
        }
      }
      struct gather {
        size_t pending = 0;
        bool reported = false; ///< done ran early: a receiver's rank died
        caf::error sender_error;
        caf::error receiver_error;
        int64_t bytes = 0; ///< what the sender ranks report having sent
        std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
      };
      auto g = std::make_shared<gather>();
      g->pending = rs.size() + 1;
      std::string transports;
      for (auto& r : rs)
        if (transports.find(r.spec.transport) == std::string::npos)
          transports += (transports.empty() ? "" : ",") + r.spec.transport;
      // A failed sync closes its Gloo channel at both ends: the next one opens a new one.
      auto forget_channel = [=] { self->state.gloo_channels.erase(source); };
      auto finish = [=] {
        if (--g->pending > 0 || g->reported)
          return;
        // A receiver's refusal names the reason; the sender's error then only echoes it.
        if (g->receiver_error) {
          forget_channel();
          return done(g->receiver_error);
        }
        if (g->sender_error)
          forget_channel();
        else if (auto c = self->state.gloo_channels.find(source);
                 c != self->state.gloo_channels.end() && uses_gloo)
          ++c->second.syncs;
        if (!g->sender_error) {
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - g->start).count();
          auto& t = self->state.syncs;
          ++t.count;
          t.bytes += g->bytes;
          t.seconds += seconds;
          runtime::logger("actors.dispatch")
              ->info("event=weight_sync source={} version={} engines={} transport={} bytes={} "
                     "seconds={:.3f}",
                     source, *version, rs.size(), transports, g->bytes, seconds);
        }
        done(g->sender_error);
      };
      auto* s = find_role(self, source);
      if (!s)
        return done(role_gone(source, op));
      const auto& send = worker_ops::send_weights;
      group_all(self, s->group, send.id, send.args(std::move(sends)), timeout_ms,
                [=](caf::expected<std::vector<caf::message>> answers) {
                  auto r = send.answers(std::move(answers));
                  if (!r)
                    g->sender_error = wrap(self, source, op, r.error());
                  else
                    for (auto bytes : *r)
                      g->bytes += bytes;
                  finish();
                });
      for (auto& r : rs) {
        auto context = prefix(source, op) + ": engine role '" + r.role + "' rank " +
                       std::to_string(r.index) + " (" + r.spec.transport + ")";
        const auto& receive = engine_ops::receive_weights;
        rank_call(self, r.rank, receive.id, receive.args(r.spec), timeout_ms + 1000,
                  [=](caf::expected<caf::message> answer) {
                    auto x = receive.answer(std::move(answer));
                    if (!x && !g->receiver_error)
                      g->receiver_error = with_context(self, context, x.error(), timeout_ms);
                    // A receiver declared dead fails the sync now: the sender may wait for it
                    // until its deadline (it answers later, unheard).
                    if (!x && x.error() == caf::sec::request_receiver_down && !g->reported) {
                      g->reported = true;
                      forget_channel();
                      done(g->receiver_error);
                    }
                    finish();
                  });
      }
    };
    if (gloo.empty())
      return launch(std::move(receivers));
    // Gloo: one persistent channel from the sender to these receivers, reused while they stay
    // the same and every sync on it succeeds. Its first sync rendezvous through the
    // dispatcher's store actor (over the cluster's connections; no port opens); the receivers
    // are its ranks 1..n. A sender or receiver replaced (a recovery) makes it another channel.
    std::string members = source;
    for (auto& h : src->ranks)
      members += "<" + caf::to_string(h.address());
    for (auto i : gloo)
      members += "|" + caf::to_string(receivers[i].rank.address());
    auto& channel = st.gloo_channels[source];
    if (channel.members != members) {
      channel = gloo_channel_record{};
      channel.members = std::move(members);
      channel.name = base + "-gloo";
      ++st.gloo_channels_opened;
    }
    if (!st.rendezvous)
      st.rendezvous = spawn_rendezvous_store(self->system(), caf::actor_cast<caf::actor>(self));
    auto world = static_cast<int32_t>(gloo.size() + 1);
    int32_t rank = 1;
    for (auto i : gloo) {
      auto& spec = receivers[i].spec;
      spec.channel = channel.name;
      spec.store = st.rendezvous;
      spec.world_size = world;
      spec.rank = rank++;
      spec.delta = st.delta;
    }
    launch(std::move(receivers));
  };
}


/// `op(args)` on every live rank of every engine role; `k` gets each answer, then
/// `done` the first error. An engine role whose ranks all died fails with `no_live_engine`.
template <class R, class... Declared>
step live_engines_step(self_ptr self, const op_ref<R(Declared...)>& op, caf::message args,
                       int64_t timeout_ms, std::function<void(const std::common_type_t<R>&)> k) {
  return [=](done_fn done) {
    struct target {
      std::string role;
      size_t rank;
      caf::actor handle;
    };
    std::vector<target> targets;
    for (auto& name : engine_roles(self)) {
      auto& e = self->state.roles.at(name);
      size_t live = 0;
      for (size_t r = 0; r < e.ranks.size(); ++r)
        if (e.alive(r)) {
          targets.push_back({name, r, e.ranks[r]});
          ++live;
        }
      if (live == 0 && !e.ranks.empty())
        return done(no_live_engine(e, name, op.id));
    }
    if (targets.empty())
      return done(caf::error{});
    auto pending = std::make_shared<size_t>(targets.size());
    auto failed = std::make_shared<caf::error>();
    for (auto& t : targets) {
      auto context = prefix(t.role, op.id) + ": engine rank " + std::to_string(t.rank);
      rank_call(self, t.handle, op.id, args, timeout_ms, [=](caf::expected<caf::message> answer) {
        auto r = op.answer(std::move(answer));
        if (!r && !*failed)
          *failed = with_context(self, context, r.error(), timeout_ms);
        if (r)
          k(*r);
        if (--*pending == 0)
          done(*failed);
      });
    }
  };
}

/// The highest weight version any live engine holds plus one, or `least` when that is higher,
/// into `version`.
step next_version_step(self_ptr self, std::shared_ptr<int64_t> version, int64_t least,
                       int64_t timeout_ms) {
  return [=](done_fn done) {
    *version = std::max(self->state.weight_version + 1, least);
    live_engines_step(self, engine_ops::weight_version, engine_ops::weight_version.args(),
                      timeout_ms, [=](const int64_t& v) { *version = std::max(*version, v + 1); })(
        std::move(done));
  };
}

} // namespace

caf::error check_sync_args(self_ptr self, const std::string& role, const caf::message& args) {
  const auto op = dispatcher_ops::sync_weights.id;
  auto& st = self->state;
  if (st.roles.at(role).engine)
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": weights are synced from a training role to the "
                                         "engines, not from an engine role");
  if (engine_roles(self).empty())
    return make_error(errc::not_found, prefix(role, op) + ": no engine role is registered");
  if (!args.empty() && !args.match_elements<std::string>() &&
      !args.match_elements<std::string, int64_t>())
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": takes no arguments or a pause mode (\"keep\" or "
                                         "\"abort\") and optionally the least version, got " +
                          caf::to_string(args));
  if (args.match_elements<std::string, int64_t>() && args.get_as<int64_t>(1) < 0)
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": the least version must be >= 0, got " +
                          std::to_string(args.get_as<int64_t>(1)));
  if (!args.empty() && args.get_as<std::string>(0) != "keep" &&
      args.get_as<std::string>(0) != "abort")
    return make_error(errc::invalid_argument, prefix(role, op) + ": unknown pause mode '" +
                                                  args.get_as<std::string>(0) +
                                                  "' (keep or abort)");
  if (!args.empty() && args.get_as<std::string>(0) == "abort" && st.colocated.count(role))
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": pause mode 'abort' needs engines that are not "
                                         "colocated with the role (colocated engines sleep "
                                         "while it trains; nothing runs to abort)");
  return caf::error{};
}

void sync_call(self_ptr self, const std::string& role, const std::string& pause_mode,
               int64_t least_version, int64_t timeout_ms, reply_fn k) {
  auto& st = self->state;
  auto engines = engine_roles(self);
  auto version = std::make_shared<int64_t>(0);
  // A failed internal step (reading the versions, a pause or resume of an engine that died in
  // between) is this sync's failure, and says so.
  auto in_sync = [=](const caf::error& err, const char* doing) {
    return with_context(self, prefix(role, dispatcher_ops::sync_weights.id) + ": " + doing, err,
                        timeout_ms);
  };
  auto steps = std::make_shared<std::vector<step>>();
  auto versions = next_version_step(self, version, least_version, timeout_ms);
  steps->push_back([=](done_fn done) {
    versions([=](caf::error err) {
      done(err ? in_sync(err, "reading the engines' weight versions") : caf::error{});
    });
  });
  bool colocated = st.colocated.count(role) > 0;
  if (colocated) {
    // Wake engine weights → transfer → offload the policy → wake the engines' KV cache.
    std::set<std::string> keep(engines.begin(), engines.end());
    for (auto& s : prepare_steps(self, role, true, false, timeout_ms, keep))
      steps->push_back(std::move(s));
    for (auto& name : engines)
      if (st.colocated.count(name))
        steps->push_back(residency_step(self, name, true, {true, false}, timeout_ms));
    steps->push_back(transfer_step(self, role, version, timeout_ms));
    steps->push_back(residency_step(self, role, false, {}, timeout_ms));
    for (auto& name : engines)
      if (st.colocated.count(name))
        steps->push_back(residency_step(self, name, true, {false, true}, timeout_ms));
    run_steps(steps, 0, [=](caf::error err) {
      if (err)
        return k(std::move(err));
      self->state.weight_version = *version;
      k(op_result{caf::make_message(*version)});
    });
    return;
  }
  // Pause → transfer → resume (resume also after a failed transfer).
  run_steps(steps, 0, [=](caf::error err) {
    if (err)
      return k(std::move(err));
    live_engines_step(self, engine_ops::pause, engine_ops::pause.args(pause_mode), timeout_ms,
                      [](const int64_t&) {})([=](caf::error pause_err) {
      if (pause_err)
        return k(in_sync(pause_err, "pausing the engines"));
      transfer_step(self, role, version, timeout_ms)([=](caf::error transfer_err) {
        live_engines_step(self, engine_ops::resume, engine_ops::resume.args(), timeout_ms,
                          [](const int64_t&) {})([=](caf::error resume_err) {
          if (transfer_err)
            return k(std::move(transfer_err));
          if (resume_err)
            return k(in_sync(resume_err, "resuming the engines"));
          self->state.weight_version = *version;
          k(op_result{caf::make_message(*version)});
        });
      });
    });
  });
}

} // namespace rlforge::actors::dispatch
