// The dispatcher's plumbing (dispatcher_state.hpp): steps, the colocated-call queue, calls to
// groups and ranks, errors with context, residency.
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

const char* dispatcher_state::name = "rlforge.dispatcher";

std::string prefix(const std::string& role, const std::string& op) {
  return "dispatcher role '" + role + "' op '" + op + "'";
}

std::string prefix(const std::string& role, caf::atom_value op) {
  // The weight sync is the dispatcher's own op, of no rank kind.
  return prefix(role, op == dispatcher_ops::sync_weights.id
                          ? std::string{dispatcher_ops::sync_weights.name}
                          : op_name(op));
}

namespace {

/// `err` re-labelled as the failure of what `context` names.
caf::error relabel(self_ptr self, const std::string& context, const caf::error& err) {
  if (err.category() == errc_category)
    return make_error(static_cast<errc>(err.code()), context + ": " + error_message(err));
  if (err == caf::sec::request_timeout)
    return make_error(errc::timeout, context + ": the group did not answer in time");
  if (err == caf::sec::request_receiver_down)
    return make_error(errc::rank_failed, context + ": the group is gone");
  return make_error(errc::rank_failed, context + ": " + self->system().render(err));
}

} // namespace

caf::error wrap(self_ptr self, const std::string& role, caf::atom_value op, const caf::error& err) {
  return relabel(self, prefix(role, op), err);
}

caf::error wrap(self_ptr self, const std::string& role, const std::string& op,
                const caf::error& err) {
  return relabel(self, prefix(role, op), err);
}

std::string role_list(const dispatcher_state& st) {
  std::string out;
  for (auto& [name, _] : st.roles)
    out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

op_dispatch dispatch_of(const role_entry& e, caf::atom_value op) {
  auto i = e.ops.find(op);
  return i == e.ops.end() ? op_dispatch{} : i->second.dispatch;
}

caf::expected<caf::atom_value> op_routed(const role_entry& e, const std::string& role,
                                         op_route route) {
  for (const auto& [id, op] : e.ops)
    if (op.dispatch.route == route)
      return id;
  return make_error(errc::internal, "dispatcher role '" + role + "': its kind declares no op " +
                                        "routed " + to_string(route));
}

// -- plumbing ----------------------------------------------------------------------------------

/// Runs `steps` one after the other; `done` gets the first error, or none after the last step.
void run_steps(std::shared_ptr<std::vector<step>> steps, size_t i, done_fn done) {
  if (i >= steps->size()) {
    done(caf::error{});
    return;
  }
  (*steps)[i]([steps, i, done](caf::error err) {
    if (err)
      done(std::move(err));
    else
      run_steps(steps, i + 1, done);
  });
}

namespace {

void pump(self_ptr self) {
  auto& st = self->state;
  if (st.busy || st.waiting.empty())
    return;
  st.busy = true;
  auto job = std::move(st.waiting.front());
  st.waiting.pop_front();
  job([self] {
    self->state.busy = false;
    pump(self);
  });
}

} // namespace

/// Runs `job` once every colocated call queued before it has finished.
void serialize(self_ptr self, serial_job job) {
  self->state.waiting.push_back(std::move(job));
  pump(self);
}

/// `op(args)` on every rank of `group`; results in rank order.
void group_all(self_ptr self, const caf::actor& group, caf::atom_value op, caf::message args,
               int64_t timeout_ms, results_fn k) {
  self->request(group, std::chrono::milliseconds{timeout_ms + 1000}, all_atom::value, op,
                std::move(args), timeout_ms)
      .then([k](std::vector<caf::message>& r) { k(std::move(r)); },
            [k](caf::error& err) { k(std::move(err)); });
}

/// `op(args)` on one rank actor; `k` runs once, with its answer, or with
/// `request_receiver_down` as soon as the rank is declared dead (engine_down: a rank on a hung
/// or unreachable node never answers, and its connection may stay open), or at the deadline.
void rank_call(self_ptr self, const caf::actor& rank, caf::atom_value op, caf::message args,
               int64_t timeout_ms, std::function<void(caf::expected<caf::message>)> k) {
  const auto addr = rank.address();
  const auto watcher = self->state.next_watcher++;
  auto settled = std::make_shared<bool>(false);
  auto settle = [self, addr, watcher, settled, k](caf::expected<caf::message> r) {
    if (*settled)
      return;
    *settled = true;
    if (auto w = self->state.rank_watchers.find(addr); w != self->state.rank_watchers.end()) {
      w->second.erase(watcher);
      if (w->second.empty())
        self->state.rank_watchers.erase(w);
    }
    k(std::move(r));
  };
  self->state.rank_watchers[addr][watcher] = [settle](const std::string& why) {
    settle(caf::make_error(caf::sec::request_receiver_down, why));
  };
  self->request(rank, std::chrono::milliseconds{timeout_ms},
                caf::message::concat(caf::make_message(op), std::move(args)))
      .then([settle](op_result& r) { settle(std::move(r.value)); },
            [settle](caf::error& err) { settle(std::move(err)); });
}

role_entry* find_role(self_ptr self, const std::string& role) {
  auto i = self->state.roles.find(role);
  return i == self->state.roles.end() ? nullptr : &i->second;
}

caf::error role_gone(const std::string& role, caf::atom_value op) {
  return make_error(errc::not_found, prefix(role, op) + ": the role was unregistered meanwhile");
}

/// The error of an engine role whose ranks have all died, naming each rank's cause.
caf::error no_live_engine(const role_entry& e, const std::string& role, caf::atom_value op) {
  std::string why;
  for (size_t r = 0; r < e.dead.size(); ++r)
    why += (r ? "; " : "") + std::string{"rank "} + std::to_string(r) + ": " + e.dead[r];
  return make_error(errc::rank_failed,
                    prefix(role, op) + ": no engine rank is left alive (" + why + ")");
}

/// The least-loaded spreading of `requests` over the live ranks of engine role `e`
/// (`spread_requests` over those ranks only); `added` is indexed by rank. Empty when no rank is
/// alive.
std::vector<size_t> spread_over_live(const role_entry& e, const std::vector<sample_request>& requests,
                                     std::vector<int64_t>& added) {
  std::vector<size_t> live;
  for (size_t r = 0; r < e.ranks.size(); ++r)
    if (e.alive(r))
      live.push_back(r);
  if (live.empty())
    return {};
  std::vector<int64_t> live_added(live.size(), 0), live_load(live.size(), 0);
  for (size_t i = 0; i < live.size(); ++i)
    live_load[i] = live[i] < e.load.size() ? e.load[live[i]] : 0;
  auto owner = spread_requests(requests, live_added, live_load);
  for (auto& o : owner)
    o = live[o];
  for (size_t i = 0; i < live.size(); ++i)
    added[live[i]] += live_added[i];
  return owner;
}

/// An error of one rank call, prefixed with `context`; keeps the `errc` code of the rank's own
/// error (invalid input stays invalid input).
caf::error with_context(self_ptr self, const std::string& context, const caf::error& err,
                        int64_t timeout_ms) {
  if (err.category() == errc_category)
    return make_error(static_cast<errc>(err.code()), context + ": " + error_message(err));
  if (err == caf::sec::request_timeout)
    return make_error(errc::timeout,
                      context + ": no answer within " + std::to_string(timeout_ms) + " ms");
  if (err == caf::sec::request_receiver_down) {
    const auto& why = err.context();
    return make_error(errc::rank_failed,
                      context + ": the rank is gone" +
                          (why.match_elements<std::string>()
                               ? " (" + why.get_as<std::string>(0) + ")"
                               : std::string{}));
  }
  return make_error(errc::rank_failed, context + ": " + self->system().render(err));
}

// -- residency ---------------------------------------------------------------------------------

namespace {

/// The op of `e`'s kind declared to move tagged state on (or off) the device.
const std::pair<const caf::atom_value, rank_op>* residency_op(const role_entry& e, bool on) {
  const auto wanted = on ? op_residency::tagged_on : op_residency::tagged_off;
  for (const auto& entry : e.ops)
    if (entry.second.dispatch.residency == wanted)
      return &entry;
  return nullptr;
}

} // namespace

void record_residency(role_entry& e, const op_dispatch& how, const caf::message& args) {
  switch (how.residency) {
    case op_residency::unchanged:
      return;
    case op_residency::everything_on:
      e.model = e.optimizer = true;
      return;
    case op_residency::tagged_on:
    case op_residency::tagged_off: {
      const bool on = how.residency == op_residency::tagged_on;
      const auto& tags = args.match_elements<std::vector<std::string>>()
                             ? args.get_as<std::vector<std::string>>(0)
                             : std::vector<std::string>{};
      auto has = [&](const std::string& t) {
        return tags.empty() || std::find(tags.begin(), tags.end(), t) != tags.end();
      };
      if (has(how.model_tag))
        e.model = on;
      if (has(how.optimizer_tag))
        e.optimizer = on;
      return;
    }
  }
}

step residency_step(self_ptr self, const std::string& role, bool on, residency_slots slots,
                    int64_t timeout_ms) {
  return [=](done_fn done) {
    auto* e = find_role(self, role);
    if (!e) {
      done(make_error(errc::not_found, prefix(role, on ? "onload" : "offload") +
                                           ": the role was unregistered meanwhile"));
      return;
    }
    const auto* op = residency_op(*e, on);
    if (op == nullptr) {
      done(make_error(errc::internal, "dispatcher role '" + role + "': its kind declares no op " +
                                          "that moves its state " + (on ? "on" : "off") +
                                          " the device"));
      return;
    }
    const auto name = op->first;
    const auto how = op->second.dispatch;
    std::vector<std::string> tags; // empty: everything
    if (!(slots.model && slots.optimizer)) {
      if (slots.model)
        tags.push_back(how.model_tag);
      if (slots.optimizer)
        tags.push_back(how.optimizer_tag);
    }
    auto args = caf::make_message(tags);
    group_all(self, e->group, name, args, timeout_ms,
              [=](caf::expected<std::vector<caf::message>> r) {
                if (!r) {
                  done(wrap(self, role, name, r.error()));
                  return;
                }
                if (auto* e2 = find_role(self, role))
                  record_residency(*e2, how, args);
                done(caf::error{});
              });
  };
}

/// The steps that make room for a call to `role` under colocation: offload (or put to sleep)
/// every other colocated role with anything on the device, except those in `keep`, then onload
/// what the call needs and is missing. Nothing when `role` is not colocated.
std::vector<step> prepare_steps(self_ptr self, const std::string& role, bool need_model,
                                bool need_optimizer, int64_t timeout_ms,
                                const std::set<std::string>& keep) {
  std::vector<step> steps;
  auto& st = self->state;
  if (!st.colocated.count(role))
    return steps;
  for (auto& [name, e] : st.roles)
    if (name != role && !keep.count(name) && st.colocated.count(name) && (e.model || e.optimizer))
      steps.push_back(residency_step(self, name, false, {}, timeout_ms));
  auto& t = st.roles.at(role);
  const residency_slots missing{need_model && !t.model, need_optimizer && !t.optimizer};
  if (missing.model || missing.optimizer)
    steps.push_back(residency_step(self, role, true, missing, timeout_ms));
  return steps;
}

} // namespace rlforge::actors::dispatch
