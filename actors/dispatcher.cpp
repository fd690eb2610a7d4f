#include "actors/dispatcher.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
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

namespace rlforge::actors {

namespace {

struct role_entry {
  caf::actor group;
  int32_t world_size = 1;
  bool engine = false;
  std::vector<caf::actor> ranks;
  std::vector<rank_info> infos;
  std::vector<process_location> where;
  /// What the dispatcher believes is on the device. Workers: model, optimizer state. Engines:
  /// weights, KV cache (awake).
  bool model = true;
  bool optimizer = true;
  /// Engines: estimated tokens of the generate calls in flight, per rank.
  std::vector<int64_t> load;
  /// Engines: why each rank died (empty while it is alive). Dead ranks get no more requests
  /// and are left out of weight syncs; the others carry on.
  std::vector<std::string> dead;

  bool alive(size_t rank) const { return rank >= dead.size() || dead[rank].empty(); }
};

/// A call that must not interleave with other colocated calls; runs `done` when finished.
using serial_job = std::function<void(std::function<void()> done)>;

/// A request submitted through `submit`, running on an engine rank until its result arrives.
struct stream_entry {
  caf::actor consumer;
  int64_t user_id = 0;
  std::string role;
  size_t rank = 0;
  int64_t cost = 0; ///< its share of the rank's load estimate
};

/// A Gloo weight channel the dispatcher keeps open from one sync source to its engines.
struct gloo_channel_record {
  std::string members; ///< the sender role and the receivers' addresses, in rank order
  std::string name;    ///< the channel name both ends key it by
  int64_t syncs = 0;   ///< syncs completed on it
};

struct dispatcher_state {
  std::map<std::string, role_entry> roles;
  /// Requests submitted through `submit`, by the dispatcher's own id for them.
  std::map<int64_t, stream_entry> streams;
  int64_t next_stream = 1;
  std::set<std::string> colocated;
  std::string transport = "auto";
  /// Gloo syncs go as deltas (dispatcher_delta_atom).
  bool delta = false;
  /// The transport each engine rank got in the last sync ("<role>/<rank>" → transport).
  std::map<std::string, std::string> last_sync;
  /// Every sync that completed: how many, the bytes the senders sent, their wall time.
  sync_totals syncs;
  /// The Gloo weight channel of each sync source (weight_sync.hpp), while it is open.
  std::map<std::string, gloo_channel_record> gloo_channels;
  /// Gloo channels opened so far (each a rendezvous); a sync on an open one reuses it.
  int64_t gloo_channels_opened = 0;
  /// Where Gloo channels rendezvous: a store actor of this process, spawned at the first one.
  rendezvous_store_actor rendezvous;
  int64_t weight_version = 0;
  bool busy = false;
  std::deque<serial_job> waiting;
  /// Calls waiting for a rank's answer (rank_call), by the rank's address: run when the rank
  /// is declared dead (a rank killed mid-call, or on a hung node, never answers).
  /// Each gets why the rank died.
  std::map<caf::actor_addr, std::map<int64_t, std::function<void(const std::string&)>>>
      rank_watchers;
  int64_t next_watcher = 1;
  static const char* name;
};

const char* dispatcher_state::name = "rlforge.dispatcher";

using self_ptr = caf::stateful_actor<dispatcher_state>*;

std::string prefix(const std::string& role, const std::string& op) {
  return "dispatcher role '" + role + "' op '" + op + "'";
}

/// Re-labels an error with the dispatcher's context (the group's own message names the rank).
caf::error wrap(self_ptr self, const std::string& role, const std::string& op,
                const caf::error& err) {
  if (err.category() == errc_category)
    return make_error(static_cast<errc>(err.code()), prefix(role, op) + ": " + error_message(err));
  if (err == caf::sec::request_timeout)
    return make_error(errc::timeout, prefix(role, op) + ": the group did not answer in time");
  if (err == caf::sec::request_receiver_down)
    return make_error(errc::rank_failed, prefix(role, op) + ": the group is gone");
  return make_error(errc::rank_failed, prefix(role, op) + ": " + self->system().render(err));
}

std::string role_list(const dispatcher_state& st) {
  std::string out;
  for (auto& [name, _] : st.roles)
    out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

bool is_batch_op(const std::string& op) {
  return op == "forward" || op == "forward_backward";
}

using reply_fn = std::function<void(caf::expected<op_result>)>;
using done_fn = std::function<void(caf::error)>;
using step = std::function<void(done_fn)>;
using results_fn = std::function<void(caf::expected<std::vector<caf::message>>)>;

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

/// Runs `job` once every colocated call queued before it has finished.
void serialize(self_ptr self, serial_job job) {
  self->state.waiting.push_back(std::move(job));
  pump(self);
}

/// `op(args)` on every rank of `group`; results in rank order.
void group_all(self_ptr self, const caf::actor& group, const std::string& op, caf::message args,
               int64_t timeout_ms, results_fn k) {
  self->request(group, std::chrono::milliseconds{timeout_ms + 1000}, all_atom::value, op,
                std::move(args), timeout_ms)
      .then([k](std::vector<caf::message>& r) { k(std::move(r)); },
            [k](caf::error& err) { k(std::move(err)); });
}

/// `op(args)` on one rank actor; `k` runs once, with its answer, or with
/// `request_receiver_down` as soon as the rank is declared dead (engine_down: a rank on a hung
/// or unreachable node never answers, and its connection may stay open), or at the deadline.
void rank_call(self_ptr self, const caf::actor& rank, const std::string& op, caf::message args,
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
  self->request(rank, std::chrono::milliseconds{timeout_ms}, call_atom::value, op, std::move(args))
      .then([settle](op_result& r) { settle(std::move(r.value)); },
            [settle](caf::error& err) { settle(std::move(err)); });
}

role_entry* find_role(self_ptr self, const std::string& role) {
  auto i = self->state.roles.find(role);
  return i == self->state.roles.end() ? nullptr : &i->second;
}

caf::error role_gone(const std::string& role, const std::string& op) {
  return make_error(errc::not_found, prefix(role, op) + ": the role was unregistered meanwhile");
}

/// The error of an engine role whose ranks have all died, naming each rank's cause.
caf::error no_live_engine(const role_entry& e, const std::string& role, const std::string& op) {
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

/// Moves `tags` of `role` on or off the device and records it (workers: offload/onload of
/// model/optimizer; engines: sleep/wake_up of weights/kv_cache). Empty tags: everything.
step residency_step(self_ptr self, const std::string& role, bool on, std::vector<std::string> tags,
                    int64_t timeout_ms) {
  return [=](done_fn done) {
    auto* e = find_role(self, role);
    if (!e) {
      done(role_gone(role, on ? "onload" : "offload"));
      return;
    }
    std::string op = e->engine ? (on ? "wake_up" : "sleep") : (on ? "onload" : "offload");
    group_all(self, e->group, op, caf::make_message(tags), timeout_ms,
              [=](caf::expected<std::vector<caf::message>> r) {
                if (!r) {
                  done(wrap(self, role, op, r.error()));
                  return;
                }
                if (auto* e2 = find_role(self, role)) {
                  bool all = tags.empty();
                  auto has = [&](const char* t) {
                    return all || std::find(tags.begin(), tags.end(), t) != tags.end();
                  };
                  if (has(e2->engine ? "weights" : "model"))
                    e2->model = on;
                  if (has(e2->engine ? "kv_cache" : "optimizer"))
                    e2->optimizer = on;
                }
                done(caf::error{});
              });
  };
}

/// The steps that make room for a call to `role` under colocation: offload (or put to sleep)
/// every other colocated role with anything on the device, except those in `keep`, then onload
/// what the call needs and is missing. Nothing when `role` is not colocated.
std::vector<step> prepare_steps(self_ptr self, const std::string& role, bool need_model,
                                bool need_optimizer, int64_t timeout_ms,
                                const std::set<std::string>& keep = {}) {
  std::vector<step> steps;
  auto& st = self->state;
  if (!st.colocated.count(role))
    return steps;
  for (auto& [name, e] : st.roles)
    if (name != role && !keep.count(name) && st.colocated.count(name) && (e.model || e.optimizer))
      steps.push_back(residency_step(self, name, false, {}, timeout_ms));
  auto& t = st.roles.at(role);
  std::vector<std::string> tags;
  if (need_model && !t.model)
    tags.push_back(t.engine ? "weights" : "model");
  if (need_optimizer && !t.optimizer)
    tags.push_back(t.engine ? "kv_cache" : "optimizer");
  if (!tags.empty())
    steps.push_back(residency_step(self, role, true, tags, timeout_ms));
  return steps;
}

// -- training roles ----------------------------------------------------------------------------

/// Checks the arguments of a batch op before anything moves.
caf::error check_batch_args(const std::string& role, const std::string& op,
                            const caf::message& args) {
  bool with_loss = args.match_elements<batch_payload, loss_request>();
  bool ok = with_loss || (op == "forward" && args.match_elements<batch_payload>());
  if (!ok)
    return make_error(
        errc::invalid_argument,
        prefix(role, op) + ": expects (" +
            (op == "forward" ? "batch_payload[, loss_request]" : "batch_payload, loss_request") +
            "), got " + caf::to_string(args));
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

void batch_call(self_ptr self, const role_entry& entry, const std::string& role,
                const std::string& op, const caf::message& args, int64_t timeout_ms, reply_fn k) {
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

void all_call(self_ptr self, const role_entry& entry, const std::string& role,
              const std::string& op, const caf::message& args, int64_t timeout_ms, reply_fn k) {
  auto worker_op = op == "save_hf_model" ? std::string{"export_hf"} : op;
  group_all(self, entry.group, worker_op, args, timeout_ms,
            [=](caf::expected<std::vector<caf::message>> r) {
              if (!r)
                return k(wrap(self, role, op, r.error()));
              if (auto* e = find_role(self, role)) {
                // Keep the residency record true to what the workers were told.
                if (op == "init_model")
                  e->model = e->optimizer = true;
                if (op == "offload" || op == "onload" || op == "sleep" || op == "wake_up") {
                  bool on = op == "onload" || op == "wake_up";
                  const auto& tags = args.match_elements<std::vector<std::string>>()
                                         ? args.get_as<std::vector<std::string>>(0)
                                         : std::vector<std::string>{};
                  auto has = [&](const char* t) {
                    return tags.empty() || std::find(tags.begin(), tags.end(), t) != tags.end();
                  };
                  if (has(e->engine ? "weights" : "model"))
                    e->model = on;
                  if (has(e->engine ? "kv_cache" : "optimizer"))
                    e->optimizer = on;
                }
              }
              k(op_result{r->empty() ? caf::message{} : std::move((*r)[0])});
            });
}

// -- engines -----------------------------------------------------------------------------------

caf::error check_generate_args(const std::string& role, const caf::message& args) {
  const char* op = "generate";
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
                                                  const char* op,
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

void generate_call(self_ptr self, const std::string& role, const caf::message& args,
                   int64_t timeout_ms, reply_fn k) {
  const char* op = "generate";
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
      return generate_call(self, role, args, timeout_ms, k);
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
caf::error check_submit_args(const std::string& role, const caf::message& args) {
  const char* op = "submit";
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
  return check_generate_args(role, caf::make_message(requests));
}

/// Spreads a submission over the role's engine ranks (least loaded first), each rank sending
/// its results back here to be forwarded; answers the engine rank of each request. A refusal by
/// any rank refuses the whole submission (what other ranks accepted is cancelled).
void submit_call(self_ptr self, const std::string& role, const caf::message& args,
                 int64_t timeout_ms, reply_fn k) {
  const char* op = "submit";
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
                    rank_call(self, e2->ranks[a], "cancel",
                              caf::make_message(caf::actor_cast<caf::actor>(self), share_ids[a]),
                              timeout_ms, [](caf::expected<caf::message>) {});
                  forget(share_ids[a]);
                }
                if (only_gone && mark_gone(self, role, g->gone))
                  return submit_call(self, role, args, timeout_ms, k);
                k(std::move(g->error));
              });
  }
}

/// Stops requests of `consumer` submitted through the dispatcher: (consumer, ids) → int64.
void cancel_call(self_ptr self, const std::string& role, const caf::message& args,
                 int64_t timeout_ms, reply_fn k) {
  const char* op = "cancel";
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

// -- weight sync -------------------------------------------------------------------------------

std::vector<std::string> engine_roles(self_ptr self) {
  std::vector<std::string> out;
  for (auto& [name, e] : self->state.roles)
    if (e.engine)
      out.push_back(name);
  return out;
}

/// Transfers `source`'s weights to every rank of every engine role as `version`.
step transfer_step(self_ptr self, const std::string& source, std::shared_ptr<int64_t> version,
                   int64_t timeout_ms) {
  return [=](done_fn done) {
    const char* op = "save_weights_for_sampler";
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
      group_all(self, s->group, "send_weights", caf::make_message(std::move(sends)), timeout_ms,
                [=](caf::expected<std::vector<caf::message>> r) {
                  if (!r)
                    g->sender_error = wrap(self, source, op, r.error());
                  else
                    for (const auto& m : *r)
                      if (m.match_elements<int64_t>())
                        g->bytes += m.get_as<int64_t>(0);
                  finish();
                });
      for (auto& r : rs) {
        auto context = prefix(source, op) + ": engine role '" + r.role + "' rank " +
                       std::to_string(r.index) + " (" + r.spec.transport + ")";
        rank_call(self, r.rank, "receive_weights", caf::make_message(r.spec), timeout_ms + 1000,
                  [=](caf::expected<caf::message> x) {
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
    // are its ranks 1..n.
    std::string members = source;
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
step live_engines_step(self_ptr self, const std::string& op, caf::message args,
                       int64_t timeout_ms, std::function<void(const caf::message&)> k) {
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
        return done(no_live_engine(e, name, op));
    }
    if (targets.empty())
      return done(caf::error{});
    auto pending = std::make_shared<size_t>(targets.size());
    auto failed = std::make_shared<caf::error>();
    for (auto& t : targets) {
      auto context = prefix(t.role, op) + ": engine rank " + std::to_string(t.rank);
      rank_call(self, t.handle, op, args, timeout_ms,
                [=](caf::expected<caf::message> r) {
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
    live_engines_step(self, "weight_version", caf::message{}, timeout_ms, [=](const caf::message& m) {
      if (m.match_elements<int64_t>())
        *version = std::max(*version, m.get_as<int64_t>(0) + 1);
    })(std::move(done));
  };
}

step all_engines_step(self_ptr self, const std::string& op, int64_t timeout_ms) {
  return live_engines_step(self, op, caf::message{}, timeout_ms, [](const caf::message&) {});
}

void sync_call(self_ptr self, const std::string& role, const std::string& pause_mode,
               int64_t least_version, int64_t timeout_ms, reply_fn k) {
  auto& st = self->state;
  auto engines = engine_roles(self);
  auto version = std::make_shared<int64_t>(0);
  auto steps = std::make_shared<std::vector<step>>();
  steps->push_back(next_version_step(self, version, least_version, timeout_ms));
  bool colocated = st.colocated.count(role) > 0;
  if (colocated) {
    // Wake engine weights → transfer → offload the policy → wake the engines' KV cache.
    std::set<std::string> keep(engines.begin(), engines.end());
    for (auto& s : prepare_steps(self, role, true, false, timeout_ms, keep))
      steps->push_back(std::move(s));
    for (auto& name : engines)
      if (st.colocated.count(name))
        steps->push_back(residency_step(self, name, true, {"weights"}, timeout_ms));
    steps->push_back(transfer_step(self, role, version, timeout_ms));
    steps->push_back(residency_step(self, role, false, {}, timeout_ms));
    for (auto& name : engines)
      if (st.colocated.count(name))
        steps->push_back(residency_step(self, name, true, {"kv_cache"}, timeout_ms));
    run_steps(steps, 0, [=](caf::error err) {
      if (err)
        return k(std::move(err));
      self->state.weight_version = *version;
      k(op_result{caf::make_message(*version)});
    });
    return;
  }
  // Pause → transfer → resume (resume also after a failed transfer).
  steps->push_back(live_engines_step(self, "pause", caf::make_message(pause_mode), timeout_ms,
                                     [](const caf::message&) {}));
  run_steps(steps, 0, [=](caf::error err) {
    if (err)
      return k(std::move(err));
    transfer_step(self, role, version, timeout_ms)([=](caf::error transfer_err) {
      all_engines_step(self, "resume", timeout_ms)([=](caf::error resume_err) {
        if (transfer_err)
          return k(std::move(transfer_err));
        if (resume_err)
          return k(std::move(resume_err));
        self->state.weight_version = *version;
        k(op_result{caf::make_message(*version)});
      });
    });
  });
}

// -- routing -----------------------------------------------------------------------------------

struct needs {
  bool model = false;
  bool optimizer = false;
};

needs needs_of(const role_entry& e, const std::string& op) {
  if (e.engine)
    return op == "generate" || op == "submit" ? needs{true, true} : needs{};
  if (op == "forward" || op == "save_hf_model")
    return {true, false};
  if (op == "forward_backward" || op == "save_checkpoint" || op == "load_checkpoint")
    return {true, true};
  return {};
}

caf::result<op_result> route(self_ptr self, const std::string& role, const std::string& op,
                             const caf::message& args, int64_t timeout_ms) {
  auto& st = self->state;
  auto& entry = st.roles.at(role);
  caf::error bad;
  if (entry.engine && op == "generate")
    bad = check_generate_args(role, args);
  else if (entry.engine && op == "submit")
    bad = check_submit_args(role, args);
  else if (!entry.engine && is_batch_op(op))
    bad = check_batch_args(role, op, args);
  else if (op == "save_weights_for_sampler") {
    if (entry.engine)
      bad = make_error(errc::invalid_argument,
                       prefix(role, op) + ": weights are synced from a training role to the "
                                          "engines, not from an engine role");
    else if (engine_roles(self).empty())
      bad = make_error(errc::not_found, prefix(role, op) + ": no engine role is registered");
    else if (!args.empty() && !args.match_elements<std::string>() &&
             !args.match_elements<std::string, int64_t>())
      bad = make_error(errc::invalid_argument,
                       prefix(role, op) + ": takes no arguments or a pause mode (\"keep\" or "
                                          "\"abort\") and optionally the least version, got " +
                           caf::to_string(args));
    else if (args.match_elements<std::string, int64_t>() && args.get_as<int64_t>(1) < 0)
      bad = make_error(errc::invalid_argument,
                       prefix(role, op) + ": the least version must be >= 0, got " +
                           std::to_string(args.get_as<int64_t>(1)));
    else if (!args.empty() && args.get_as<std::string>(0) != "keep" &&
             args.get_as<std::string>(0) != "abort")
      bad = make_error(errc::invalid_argument,
                       prefix(role, op) + ": unknown pause mode '" + args.get_as<std::string>(0) +
                           "' (keep or abort)");
    else if (!args.empty() && args.get_as<std::string>(0) == "abort" && st.colocated.count(role))
      bad = make_error(errc::invalid_argument,
                       prefix(role, op) + ": pause mode 'abort' needs engines that are not "
                                          "colocated with the role (colocated engines sleep "
                                          "while it trains; nothing runs to abort)");
  }
  if (bad)
    return bad;
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
    if (op == "save_weights_for_sampler")
      return sync_call(self, role, args.empty() ? "keep" : args.get_as<std::string>(0),
                       args.size() == 2 ? args.get_as<int64_t>(1) : int64_t{0}, timeout_ms, k);
    auto need = needs_of(*e, op);
    auto steps = std::make_shared<std::vector<step>>(
        prepare_steps(self, role, need.model, need.optimizer, timeout_ms));
    run_steps(steps, 0, [=](caf::error err) {
      if (err)
        return k(std::move(err));
      auto* e2 = find_role(self, role);
      if (!e2)
        return k(role_gone(role, op));
      if (e2->engine && op == "generate")
        generate_call(self, role, args, timeout_ms, k);
      else if (e2->engine && op == "submit")
        submit_call(self, role, args, timeout_ms, k);
      else if (e2->engine && op == "cancel")
        cancel_call(self, role, args, timeout_ms, k);
      else if (!e2->engine && is_batch_op(op))
        batch_call(self, *e2, role, op, args, timeout_ms, k);
      else
        all_call(self, *e2, role, op, args, timeout_ms, k);
    });
  };
  bool serial = st.colocated.count(role) > 0;
  if (op == "save_weights_for_sampler")
    for (auto& name : engine_roles(self))
      serial = serial || st.colocated.count(name) > 0;
  if (serial)
    serialize(self, std::move(job));
  else
    job([] {});
  return promise;
}

// -- status ------------------------------------------------------------------------------------

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
    group_all(self, e.group, "device_memory", caf::message{}, timeout_ms,
              [=](caf::expected<std::vector<caf::message>> r) mutable {
                auto& d = *doc;
                if (r) {
                  for (size_t i = 0; i < r->size() && i < infos.size() && i < where.size(); ++i) {
                    const auto& m = (*r)[i];
                    if (!m.match_elements<int64_t, int64_t, int64_t, int64_t, int64_t>())
                      continue;
                    d["devices"][device_of(infos[i])]["cuda"] = {
                        {"device", where[i].device},       {"allocated", m.get_as<int64_t>(0)},
                        {"reserved", m.get_as<int64_t>(1)}, {"peak_allocated", m.get_as<int64_t>(2)},
                        {"free", m.get_as<int64_t>(3)},     {"total", m.get_as<int64_t>(4)}};
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
    group_all(self, e.group, "memory", caf::message{}, timeout_ms,
              [=](caf::expected<std::vector<caf::message>> r) mutable {
                auto& d = *doc;
                if (!r) {
                  d["roles"][name]["memory_error"] = error_message(r.error()).empty()
                                                         ? self->system().render(r.error())
                                                         : error_message(r.error());
                } else {
                  int64_t resident = 0;
                  for (size_t i = 0; i < r->size(); ++i) {
                    if (!(*r)[i].match_elements<int64_t, int64_t>())
                      continue;
                    auto bytes = (*r)[i].get_as<int64_t>(0);
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

// -- behavior ----------------------------------------------------------------------------------

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
                          self, group, "location", caf::message{}, 30000,
                          [=](caf::expected<std::vector<caf::message>> where) mutable {
                            if (!where)
                              return fail(where.error());
                            role_entry e;
                            e.group = group;
                            e.world_size = static_cast<int32_t>(ranks.size());
                            e.engine = kind == "engine";
                            e.ranks = handles;
                            e.infos = ranks;
                            for (auto& m : *where)
                              if (m.match_elements<std::string, int64_t, std::string,
                                                   std::string>())
                                e.where.push_back({m.get_as<std::string>(0), m.get_as<int64_t>(1),
                                                   m.get_as<std::string>(2),
                                                   m.get_as<std::string>(3)});
                            e.load.assign(handles.size(), 0);
                            if (e.engine) // requests submitted to a rank that dies are lost
                              for (auto& h : handles)
                                self->monitor(h);
                            self->state.roles[role] = std::move(e);
                            runtime::logger("actors.dispatch")
                                ->info("register role={} kind={} ranks={}", role, kind,
                                       ranks.size());
                            promise.deliver(static_cast<int32_t>(ranks.size()));
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
      [=](dispatcher_call_atom, const std::string& role, const std::string& op,
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
  return sys.spawn(dispatcher);
}

} // namespace rlforge::actors
