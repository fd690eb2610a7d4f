#include "actors/dispatcher.hpp"
#include "actors/dispatcher_state.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/batch_wire.hpp"
#include "actors/engine.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_actor.hpp"
#include "actors/rendezvous_store.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

namespace dispatch {

// -- training roles ----------------------------------------------------------------------------

namespace {

/// Checks the arguments of an op routed `split_batch` before anything moves: its declared
/// signature, then the batch itself.
caf::error check_batch_args(const std::string& role, caf::atom_value op, const rank_op& declared,
                            const caf::message& args) {
  if (!declared.accepts(args) || !args.match_element<batch_payload>(0))
    return make_error(errc::invalid_argument, prefix(role, op) + ": expects (" +
                                                  declared.signature + "), got " +
                                                  caf::to_string(args));
  const auto& payload = args.get_as<batch_payload>(0);
  auto rows = payload_rows(payload);
  if (!rows)
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": " + error_message(rows.error()));
  if (*rows - payload.pad_size < 1)
    return make_error(errc::invalid_argument,
                      prefix(role, op) + ": empty batch (" + std::to_string(*rows) + " rows, " +
                          std::to_string(payload.pad_size) + " of them padding)");
  return caf::error{};
}

/// Checks the arguments of an op routed `split_datums`: its declared signature (a
/// tinker::checked_request, which its maker checked) and at least one datum.
caf::error check_datum_args(const std::string& role, caf::atom_value op, const rank_op& declared,
                            const caf::message& args) {
  if (!declared.accepts(args))
    return make_error(errc::invalid_argument, prefix(role, op) + ": expects (" +
                                                  declared.signature + "), got a message of " +
                                                  std::to_string(args.size()) + " values");
  if (args.get_as<tinker::checked_request>(0).data().empty())
    return make_error(errc::invalid_argument, prefix(role, op) + ": a request without datums");
  return caf::error{};
}

/// Rank r of n computes datums [r * N / n, (r + 1) * N / n) of the request's N; the answers are
/// joined in rank order, which is datum order.
void datum_call(self_ptr self, const role_entry& entry, const std::string& role, caf::atom_value op,
                const caf::message& args, int64_t timeout_ms, reply_fn k) {
  const auto& request = args.get_as<tinker::checked_request>(0);
  std::vector<caf::message> chunks;
  if (entry.world_size == 1) {
    chunks.push_back(args); // shares the request: no copy
  } else {
    const auto n = static_cast<size_t>(entry.world_size);
    const size_t datums = request.data().size();
    for (size_t r = 0; r < n; ++r)
      chunks.push_back(caf::make_message(request.slice(r * datums / n, (r + 1) * datums / n)));
  }
  self->request(entry.group, std::chrono::milliseconds{timeout_ms + 1000}, mesh_atom::value, op,
                std::move(chunks), timeout_ms)
      .then(
          [=](std::vector<caf::message>& results) {
            tinker_pass_result joined;
            std::vector<std::pair<std::map<std::string, double>, double>> metric_parts;
            for (size_t r = 0; r < results.size(); ++r) {
              if (!results[r].match_elements<tinker_pass_result>())
                return k(make_error(errc::internal, prefix(role, op) + ": rank " +
                                                        std::to_string(r) + " answered " +
                                                        caf::to_string(results[r])));
              auto& part = results[r].get_mutable_as<tinker_pass_result>(0);
              if (part.datum_outputs.empty())
                continue; // a rank that got no datums
              for (auto& d : part.datum_outputs)
                joined.datum_outputs.push_back(std::move(d));
              joined.tokens += part.tokens;
              metric_parts.emplace_back(std::move(part.metrics), part.tokens);
            }
            joined.metrics = combine_metrics(metric_parts);
            k(op_result{caf::make_message(std::move(joined))});
          },
          [=](caf::error& err) { k(wrap(self, role, op, err)); });
}

void batch_call(self_ptr self, const role_entry& entry, const std::string& role, caf::atom_value op,
                const caf::message& args, int64_t timeout_ms, reply_fn k) {
  const auto& payload = args.get_as<batch_payload>(0);
  std::vector<caf::message> chunks;
  int64_t added = 0;
  if (entry.world_size == 1) {
    chunks.push_back(args); // shares the payload: no copy
  } else {
    auto padded = pad_payload(payload, entry.world_size);
    if (!padded)
      return k(make_error(errc::invalid_argument,
                          prefix(role, op) + ": " + error_message(padded.error())));
    added = padded->pad_size - payload.pad_size;
    auto shards = shard_payload(*padded, entry.world_size);
    if (!shards)
      return k(make_error(errc::invalid_argument,
                          prefix(role, op) + ": " + error_message(shards.error())));
    for (auto& s : *shards) {
      if (args.size() == 1)
        chunks.push_back(caf::make_message(std::move(s)));
      else
        chunks.push_back(caf::make_message(std::move(s), args.get_as<loss_request>(1)));
    }
  }
  self->request(entry.group, std::chrono::milliseconds{timeout_ms + 1000}, mesh_atom::value, op,
                std::move(chunks), timeout_ms)
      .then(
          [=](std::vector<caf::message>& results) {
            std::vector<batch_result> parts;
            parts.reserve(results.size());
            for (size_t r = 0; r < results.size(); ++r) {
              if (!results[r].match_elements<batch_result>())
                return k(make_error(errc::internal, prefix(role, op) + ": rank " +
                                                        std::to_string(r) + " answered " +
                                                        caf::to_string(results[r])));
              parts.push_back(std::move(results[r].get_mutable_as<batch_result>(0)));
            }
            if (parts.size() == 1 && added == 0)
              return k(op_result{caf::make_message(std::move(parts[0]))});
            auto merged = merge_results(parts, added);
            if (!merged)
              return k(make_error(errc::internal,
                                  prefix(role, op) + ": " + error_message(merged.error())));
            k(op_result{caf::make_message(std::move(*merged))});
          },
          [=](caf::error& err) { k(wrap(self, role, op, err)); });
}

void all_call(self_ptr self, const role_entry& entry, const std::string& role, caf::atom_value op,
              const caf::message& args, int64_t timeout_ms, reply_fn k) {
  group_all(self, entry.group, op, args, timeout_ms,
            [=](caf::expected<std::vector<caf::message>> r) {
              if (!r)
                return k(wrap(self, role, op, r.error()));
              // Keep the residency record true to what the ranks were told.
              if (auto* e = find_role(self, role))
                record_residency(*e, dispatch_of(*e, op), args);
              k(op_result{r->empty() ? caf::message{} : std::move((*r)[0])});
            });
}

} // namespace

// -- routing -----------------------------------------------------------------------------------

namespace {


/// Checks a call's arguments before anything moves, by how its op is routed.
caf::error check_call_args(self_ptr self, const std::string& role, caf::atom_value op,
                           const caf::message& args) {
  auto& entry = self->state.roles.at(role);
  if (op == dispatcher_ops::sync_weights.id)
    return check_sync_args(self, role, args);
  switch (dispatch_of(entry, op).route) {
    case op_route::split_batch:
      return check_batch_args(role, op, entry.ops.at(op), args);
    case op_route::split_datums:
      return check_datum_args(role, op, entry.ops.at(op), args);
    case op_route::spread_requests:
      return check_generate_args(role, op, args);
    case op_route::stream_requests:
      return check_submit_args(role, op, args);
    case op_route::cancel_streams:
    case op_route::every_rank:
      break; // checked by the ranks, whose answer names the op
  }
  return caf::error{};
}

/// Runs a call on the role's ranks the way its op declares (`op_dispatch::route`).
void run_routed(self_ptr self, const role_entry& e, const std::string& role, caf::atom_value op,
                const caf::message& args, int64_t timeout_ms, reply_fn k) {
  switch (dispatch_of(e, op).route) {
    case op_route::split_batch:
      return batch_call(self, e, role, op, args, timeout_ms, k);
    case op_route::split_datums:
      return datum_call(self, e, role, op, args, timeout_ms, k);
    case op_route::spread_requests:
      return generate_call(self, role, op, args, timeout_ms, k);
    case op_route::stream_requests:
      return submit_call(self, role, op, args, timeout_ms, k);
    case op_route::cancel_streams:
      return cancel_call(self, role, op, args, timeout_ms, k);
    case op_route::every_rank:
      return all_call(self, e, role, op, args, timeout_ms, k);
  }
}

caf::result<op_result> route(self_ptr self, const std::string& role, caf::atom_value op,
                             const caf::message& args, int64_t timeout_ms) {
  auto& st = self->state;
  if (auto bad = check_call_args(self, role, op, args))
    return bad;
  // The weight sync is the dispatcher's own op (its steps onload and offload as they go); every
  // other op runs on the role's ranks after what it needs is resident.
  const bool sync = op == dispatcher_ops::sync_weights.id;
  auto promise = self->make_response_promise<op_result>();
  auto job = [=](std::function<void()> finished) mutable {
    reply_fn k = [=](caf::expected<op_result> r) mutable {
      if (r)
        promise.deliver(std::move(*r));
      else
        promise.deliver(std::move(r.error()));
      finished();
    };
    auto* e = find_role(self, role);
    if (!e)
      return k(role_gone(role, op));
    if (sync)
      return sync_call(self, role, args.empty() ? "keep" : args.get_as<std::string>(0),
                       args.size() == 2 ? args.get_as<int64_t>(1) : int64_t{0}, timeout_ms, k);
    const auto how = dispatch_of(*e, op);
    auto steps = std::make_shared<std::vector<step>>(
        prepare_steps(self, role, how.needs_model, how.needs_optimizer, timeout_ms));
    run_steps(steps, 0, [=](caf::error err) {
      if (err)
        return k(std::move(err));
      auto* e2 = find_role(self, role);
      if (!e2)
        return k(role_gone(role, op));
      run_routed(self, *e2, role, op, args, timeout_ms, k);
    });
  };
  bool serial = st.colocated.count(role) > 0;
  if (sync)
    for (auto& name : engine_roles(self))
      serial = serial || st.colocated.count(name) > 0;
  if (serial)
    serialize(self, std::move(job));
  else
    job([] {});
  return promise;
}

} // namespace

// -- status ------------------------------------------------------------------------------------

namespace {

std::string device_of(const rank_info& info) {
  if (info.device_ids.empty())
    return info.node_id + "/cpu";
  std::string out = info.node_id + "/gpu";
  for (size_t i = 0; i < info.device_ids.size(); ++i)
    out += (i ? "," : "") + std::to_string(info.device_ids[i]);
  return out;
}


caf::result<std::string> status(self_ptr self, int64_t timeout_ms) {
  auto& st = self->state;
  auto doc = std::make_shared<nlohmann::json>();
  (*doc)["weight_version"] = st.weight_version;
  (*doc)["transport"] = st.transport;
  (*doc)["delta"] = st.delta;
  (*doc)["last_sync"] = st.last_sync;
  (*doc)["gloo_channels_opened"] = st.gloo_channels_opened;
  for (auto& [from, c] : st.gloo_channels)
    (*doc)["gloo_channels"][from] = {{"channel", c.name}, {"syncs", c.syncs}};
  (*doc)["roles"] = nlohmann::json::object();
  (*doc)["devices"] = nlohmann::json::object();
  for (auto& [name, e] : st.roles) {
    nlohmann::json r{{"kind", e.engine ? "engine" : "worker"},
                     {"ranks", e.world_size},
                     {"colocated", st.colocated.count(name) > 0}};
    r[e.engine ? "weights_awake" : "model_on_device"] = e.model;
    r[e.engine ? "kv_cache_awake" : "optimizer_on_device"] = e.optimizer;
    (*doc)["roles"][name] = std::move(r);
  }
  auto promise = self->make_response_promise<std::string>();
  auto pending = std::make_shared<size_t>(st.roles.size());
  if (*pending == 0)
    return doc->dump();
  // Roles with ranks on real CUDA devices also report those devices as the caching allocator
  // and the driver see them ("cuda" under the device's entry).
  std::vector<std::string> on_cuda;
  for (auto& [name, e] : st.roles)
    if (std::any_of(e.where.begin(), e.where.end(),
                    [](const process_location& p) { return p.device.rfind("cuda", 0) == 0; }))
      on_cuda.push_back(name);
  *pending += on_cuda.size();
  for (auto& name : on_cuda) {
    auto& e = st.roles.at(name);
    auto infos = e.infos;
    auto where = e.where;
    const auto& op = rank_ops::device_memory;
    group_all(
        self, e.group, op.id, op.args(), timeout_ms,
        [=](caf::expected<std::vector<caf::message>> answers) mutable {
          auto& d = *doc;
          auto r = op.answers(std::move(answers));
          if (r) {
            for (size_t i = 0; i < r->size() && i < infos.size() && i < where.size(); ++i) {
              auto [allocated, reserved, peak, free, total] = (*r)[i];
              d["devices"][device_of(infos[i])]["cuda"] = {
                  {"device", where[i].device}, {"allocated", allocated}, {"reserved", reserved},
                  {"peak_allocated", peak},    {"free", free},           {"total", total}};
            }
          } else {
            d["roles"][name]["device_memory_error"] = self->system().render(r.error());
          }
          if (--*pending == 0)
            promise.deliver(d.dump());
        });
  }
  for (auto& [name, e] : st.roles) {
    auto infos = e.infos;
    // Workers and engines declare `memory` alike: (resident bytes, host bytes).
    static_assert(std::is_same_v<decltype(worker_ops::memory), decltype(engine_ops::memory)>);
    const auto& op = worker_ops::memory;
    group_all(self, e.group, op.id, op.args(), timeout_ms,
              [=](caf::expected<std::vector<caf::message>> answers) mutable {
                auto& d = *doc;
                auto r = op.answers(std::move(answers));
                if (!r) {
                  d["roles"][name]["memory_error"] = error_message(r.error()).empty()
                                                         ? self->system().render(r.error())
                                                         : error_message(r.error());
                } else {
                  int64_t resident = 0;
                  for (size_t i = 0; i < r->size(); ++i) {
                    auto bytes = std::get<0>((*r)[i]);
                    resident += bytes;
                    auto dev = i < infos.size() ? device_of(infos[i]) : std::string{"unknown"};
                    auto& slot = d["devices"][dev][name];
                    slot = (slot.is_number() ? slot.get<int64_t>() : 0) + bytes;
                  }
                  d["roles"][name]["resident_bytes"] = resident;
                }
                if (--*pending == 0)
                  promise.deliver(d.dump());
              });
  }
  return promise;
}

} // namespace

// -- behavior ----------------------------------------------------------------------------------

namespace {

caf::result<int32_t> register_role(self_ptr self, const std::string& role, const caf::actor& group,
                                   const std::string& kind) {
  if (role.empty())
    return make_error(errc::invalid_argument, "dispatcher: a role name must not be empty");
  if (!group)
    return make_error(errc::invalid_argument,
                      "dispatcher: role '" + role + "' registered with an invalid group");
  if (kind != "worker" && kind != "engine")
    return make_error(errc::invalid_argument, "dispatcher: role '" + role + "': unknown kind '" +
                                                  kind + "' (kinds: worker, engine)");
  auto promise = self->make_response_promise<int32_t>();
  auto fail = [=](caf::error err) mutable { promise.deliver(wrap(self, role, "register", err)); };
  self->request(group, std::chrono::seconds(30), ranks_atom::value)
      .then(
          [=](std::vector<rank_info>& ranks) mutable {
            if (ranks.empty()) {
              promise.deliver(make_error(errc::invalid_argument,
                                         "dispatcher: role '" + role + "' has no ranks"));
              return;
            }
            self->request(group, std::chrono::seconds(30), handles_atom::value)
                .then(
                    [=](std::vector<caf::actor>& handles) mutable {
                      group_all(
                          self, group, rank_ops::location.id, rank_ops::location.args(), 30000,
                          [=](caf::expected<std::vector<caf::message>> answers) mutable {
                            auto where = rank_ops::location.answers(std::move(answers));
                            if (!where)
                              return fail(where.error());
                            role_entry e;
                            e.group = group;
                            e.world_size = static_cast<int32_t>(ranks.size());
                            e.engine = kind == "engine";
                            e.ranks = handles;
                            e.infos = ranks;
                            for (auto& [host, pid, address, device] : *where)
                              e.where.push_back({host, pid, address, device});
                            e.load.assign(handles.size(), 0);
                            // How each op runs is declared with the op, in the kind the ranks
                            // were spawned as (registered in this process too).
                            group_all(
                                self, group, rank_ops::kind.id, rank_ops::kind.args(), 30000,
                                [=](caf::expected<std::vector<caf::message>> answers) mutable {
                                  auto kinds = rank_ops::kind.answers(std::move(answers));
                                  if (!kinds)
                                    return fail(kinds.error());
                                  if (kinds->empty())
                                    return fail(make_error(errc::internal,
                                                           "the ranks did not name their kind"));
                                  const auto& name = kinds->front();
                                  auto k = find_kind(name);
                                  if (!k)
                                    return fail(k.error());
                                  e.ops = k->ops;
                                  if (e.engine) // requests submitted to a rank that dies are lost
                                    for (auto& h : handles)
                                      self->monitor(h);
                                  self->state.roles[role] = std::move(e);
                                  runtime::logger("actors.dispatch")
                                      ->info("register role={} kind={} ranks={} rank_kind={}",
                                             role, kind, ranks.size(), name);
                                  promise.deliver(static_cast<int32_t>(ranks.size()));
                                });
                          });
                    },
                    [=](caf::error& err) mutable { fail(err); });
          },
          [=](caf::error& err) mutable { fail(err); });
  return promise;
}


caf::behavior dispatcher(self_ptr self) {
  self->set_down_handler([=](caf::down_msg& dm) { engine_down(self, dm.source, dm.reason); });
  return {
      [=](generation_result& r) { forward_result(self, r); },
      [=](dispatcher_register_atom, const std::string& role, const caf::actor& group) {
        return register_role(self, role, group, "worker");
      },
      [=](dispatcher_register_atom, const std::string& role, const caf::actor& group,
          const std::string& kind) { return register_role(self, role, group, kind); },
      [=](dispatcher_unregister_atom, const std::string& role) -> caf::result<void> {
        auto& st = self->state;
        if (!st.roles.count(role))
          return make_error(errc::not_found,
                            "dispatcher: unregister: no group registered for role '" + role +
                                "' (registered: " + role_list(st) + ")");
        st.roles.erase(role);
        runtime::logger("actors.dispatch")->info("unregister role={}", role);
        return caf::unit;
      },
      [=](dispatcher_call_atom, const std::string& role, caf::atom_value op,
          const caf::message& args, int64_t timeout_ms) -> caf::result<op_result> {
        auto& st = self->state;
        if (!st.roles.count(role))
          return make_error(errc::not_found, prefix(role, op) + ": no group registered for role '" +
                                                 role + "' (registered: " + role_list(st) + ")");
        if (timeout_ms <= 0)
          return make_error(errc::invalid_argument, prefix(role, op) +
                                                        ": timeout must be > 0 ms, got " +
                                                        std::to_string(timeout_ms));
        return route(self, role, op, args, timeout_ms);
      },
      [=](dispatcher_colocate_atom, const std::vector<std::string>& roles) -> caf::result<void> {
        std::set<std::string> set;
        for (auto& r : roles) {
          if (r.empty())
            return make_error(errc::invalid_argument, "dispatcher: colocate: empty role name");
          set.insert(r);
        }
        if (set.size() == 1)
          return make_error(errc::invalid_argument,
                            "dispatcher: colocate needs at least two roles, got only '" +
                                *set.begin() + "'");
        self->state.colocated = std::move(set);
        return caf::unit;
      },
      [=](dispatcher_transport_atom, const std::string& transport) -> caf::result<void> {
        if (transport != "auto" && transport != "in_process" && transport != "shm" &&
            transport != "cuda_ipc" && transport != "gloo")
          return make_error(errc::invalid_argument, "dispatcher: unknown weight transport '" +
                                                        transport +
                                                        "' (auto, in_process, shm, cuda_ipc, "
                                                        "gloo)");
        if (self->state.delta && transport != "auto" && transport != "gloo")
          return make_error(errc::invalid_argument,
                            "dispatcher: weight transport '" + transport +
                                "' moves whole weights, and delta syncs are on (turn them off "
                                "first)");
        self->state.transport = transport;
        return caf::unit;
      },
      [=](dispatcher_delta_atom, bool on) -> caf::result<void> {
        const auto& t = self->state.transport;
        if (on && t != "auto" && t != "gloo")
          return make_error(errc::invalid_argument,
                            "dispatcher: delta syncs go through Gloo channels; the weight "
                            "transport is forced to '" + t + "', which moves whole weights");
        self->state.delta = on;
        return caf::unit;
      },
      [=](dispatcher_syncs_atom) -> caf::result<int64_t, int64_t, double> {
        const auto& t = self->state.syncs;
        return {t.count, t.bytes, t.seconds};
      },
      [=](dispatcher_status_atom, int64_t timeout_ms) -> caf::result<std::string> {
        if (timeout_ms <= 0)
          return make_error(errc::invalid_argument, "dispatcher: status timeout must be > 0 ms");
        return status(self, timeout_ms);
      },
      [=](dispatcher_lcm_atom) {
        int32_t out = 1;
        for (auto& [_, e] : self->state.roles)
          if (!e.engine)
            out = std::lcm(out, e.world_size);
        return out;
      },
      [=](dispatcher_roles_atom) {
        std::vector<std::string> out;
        for (auto& [name, _] : self->state.roles)
          out.push_back(name);
        return out;
      },
  };
}

} // namespace

} // namespace dispatch

std::vector<size_t> spread_requests(const std::vector<sample_request>& requests,
                                    std::vector<int64_t>& added,
                                    const std::vector<int64_t>& in_flight) {
  const size_t n = added.size();
  std::vector<size_t> owner(requests.size(), 0);
  if (n == 0)
    return owner;
  auto load = [&](size_t j) { return added[j] + (j < in_flight.size() ? in_flight[j] : 0); };
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    size_t best = 0;
    for (size_t j = 1; j < n; ++j)
      if (load(j) < load(best))
        best = j;
    owner[i] = best;
    added[best] += std::max<int64_t>(1, r.num_samples) *
                   (static_cast<int64_t>(r.prompt.size()) + std::max<int64_t>(0, r.max_tokens));
  }
  return owner;
}

caf::actor spawn_dispatcher(caf::actor_system& sys) {
  return sys.spawn(dispatch::dispatcher);
}

} // namespace rlforge::actors
