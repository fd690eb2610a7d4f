#include "actors/engine.hpp"
#include "actors/engine_state.hpp"

#include <c10/core/GradMode.h>
#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/backend_seam.hpp"
#include "actors/batch_wire.hpp"
#include "actors/engine_requests.hpp"
#include "actors/engine_weights.hpp"
#include "actors/rank_device.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/devices.hpp"
#include "backends/engine/continuous_engine.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/detokenizer.hpp"
#include "backends/model/model_config.hpp"
#include "backends/storage_bytes.hpp"
#include "backends/storage_copier.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace engine_detail {

be::causal_lm& model_of(engine_state& st, const char* op) {
  if (!st.model)
    be::fail(error_code::invalid_argument,
             std::string{op} + " before init_model: the engine has no model yet");
  return *st.model;
}

std::vector<std::string> parse_tags(const std::vector<std::string>& tags, const char* op) {
  if (tags.empty())
    return {tag_weights, tag_kv_cache};
  for (auto& t : tags)
    if (t != tag_weights && t != tag_kv_cache)
      be::fail(error_code::invalid_argument,
               std::string{op} + ": unknown tag '" + t + "' (tags: weights, kv_cache)");
  return tags;
}

void check_awake(const engine_state& st) {
  for (const char* tag : {tag_weights, tag_kv_cache})
    if (st.asleep.count(tag))
      be::fail(error_code::invalid_argument,
               std::string{"engine is asleep ("} + tag + "); call wake_up");
}

/// Whether requests pinned to `version` are queued or running.
bool version_in_use(const engine_state& st, int64_t version) {
  if (!st.engine)
    return false;
  auto keys = st.engine->keys();
  return std::find(keys.begin(), keys.end(), version) != keys.end();
}

// -- results --------------------------------------------------------------------------------

/// Sends a stream request's result (or failure) to its consumer.
void send_result(rank_context& ctx, engine_state& st, const caf::actor& consumer,
                 int64_t user_id, std::vector<sample_output> rows, const caf::error& err) {
  generation_result r;
  r.id = user_id;
  r.samples = std::move(rows);
  if (err) {
    r.error = error_message(err);
    r.error_code = err.category() == errc_category ? static_cast<int32_t>(err.code())
                                                   : static_cast<int32_t>(errc::internal);
  }
  r.engine_rank = st.rank;
  st.streams.erase({consumer, user_id});
  ctx.send(consumer, caf::make_message(std::move(r)));
}

/// A request left the engine (finished, stopped or failed): its rows go to its call or its
/// consumer. A failed request fails its whole call, whose other requests are stopped.
void finish_request(rank_context& ctx, engine_state& st, uint64_t id,
                    std::vector<sample_output> rows, const caf::error& err = caf::error{}) {
  auto node = st.origins.extract(id);
  if (node.empty())
    return;
  const auto& o = node.mapped();
  if (o.call == 0) {
    send_result(ctx, st, o.consumer, o.user_id, std::move(rows), err);
    return;
  }
  auto c = st.calls.find(o.call);
  if (c == st.calls.end())
    return;
  if (err) {
    for (auto other : c->second.ids)
      if (other != id && st.origins.erase(other))
        st.engine->abort(other);
    ctx.deliver(o.call, err);
    st.calls.erase(c);
    return;
  }
  c->second.rows[o.index] = std::move(rows);
  if (--c->second.remaining > 0)
    return;
  std::vector<sample_output> out;
  for (auto& request_rows : c->second.rows)
    for (auto& row : request_rows)
      out.push_back(std::move(row));
  ctx.deliver(o.call, caf::make_message(std::move(out)));
  st.calls.erase(c);
}

/// Stops request `id` in the engine and hands back what it generated.
void stop_request(rank_context& ctx, engine_state& st, uint64_t id,
                  const caf::error& err) {
  auto out = st.engine->abort(id);
  finish_request(ctx, st, id, out ? to_outputs(std::move(*out)) : std::vector<sample_output>{},
                 err);
}

/// Answers every call and stream request in flight with `err` (the engine is being replaced).
void fail_everything(rank_context& ctx, engine_state& st, const caf::error& err) {
  std::vector<uint64_t> ids;
  for (auto& [id, o] : st.origins)
    ids.push_back(id);
  for (auto id : ids)
    if (st.origins.count(id))
      finish_request(ctx, st, id, {}, err);
  for (auto& q : st.queue) {
    if (q.ticket)
      ctx.deliver(q.ticket, err);
    else
      for (auto uid : q.ids)
        send_result(ctx, st, q.consumer, uid, {}, err);
  }
  st.queue.clear();
}

// -- admission ------------------------------------------------------------------------------

/// Starts the requests of a `generate` call whose reply is deferred under `ticket`.
void start_call(engine_state& st, uint64_t ticket, std::vector<be::engine_request> requests) {
  auto& call = st.calls[ticket];
  call.rows.resize(requests.size());
  call.remaining = requests.size();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto id = st.next_id++;
    st.weights.touch(requests[i].key);
    st.origins[id] = origin{ticket, i, {}, 0, 0, {}, requests[i].key};
    call.ids.push_back(id);
    st.engine->add(id, std::move(requests[i]));
  }
}

/// Starts the requests of a stream submission.
void start_stream(engine_state& st, const caf::actor& consumer, const std::vector<int64_t>& ids,
                  std::vector<be::engine_request> requests, int64_t timeout_ms,
                  clock_type::time_point deadline) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto id = st.next_id++;
    st.weights.touch(requests[i].key);
    st.origins[id] = origin{0, i, consumer, ids[i], timeout_ms, deadline, requests[i].key};
    st.streams[{consumer, ids[i]}] = id;
    st.engine->add(id, std::move(requests[i]));
  }
}

/// Checks a stream submission's own arguments (not its requests).
void check_submission(const engine_state& st, const caf::actor& consumer,
                      const std::vector<int64_t>& ids, size_t count, int64_t timeout_ms) {
  if (!consumer)
    be::fail(error_code::invalid_argument, "submit: the consumer actor is invalid");
  if (ids.size() != count)
    be::fail(error_code::invalid_argument, "submit: " + std::to_string(ids.size()) +
                                               " ids for " + std::to_string(count) +
                                               " requests (need one id per request)");
  if (timeout_ms <= 0)
    be::fail(error_code::invalid_argument,
             "submit: timeout_ms must be > 0, got " + std::to_string(timeout_ms));
  std::set<int64_t> seen;
  for (auto id : ids) {
    if (!seen.insert(id).second)
      be::fail(error_code::invalid_argument,
               "submit: id " + std::to_string(id) + " appears twice in the submission");
    if (st.streams.count({consumer, id}))
      be::fail(error_code::invalid_argument,
               "submit: id " + std::to_string(id) + " is already in flight for this consumer");
    for (auto& q : st.queue)
      if (!q.ticket && q.consumer == consumer &&
          std::find(q.ids.begin(), q.ids.end(), id) != q.ids.end())
        be::fail(error_code::invalid_argument,
                 "submit: id " + std::to_string(id) + " is already queued for this consumer");
  }
}

/// Releases what arrived while paused, in arrival order; returns how many calls/submissions.
int64_t release_queue(rank_context& ctx, engine_state& st) {
  auto queue = std::move(st.queue);
  st.queue.clear();
  for (auto& q : queue) {
    try {
      check_awake(st);
      auto requests =
          check_requests(q.requests, *st.engine, st.weights, st.tokenizer,
                         q.ticket ? engine_ops::generate.name : engine_ops::submit.name);
      if (q.ticket)
        start_call(st, q.ticket, std::move(requests));
      else
        start_stream(st, q.consumer, q.ids, std::move(requests), q.timeout_ms, q.deadline);
    } catch (...) {
      auto err = current_exception_to_error(q.ticket ? "queued generate" : "queued submit");
      if (q.ticket)
        ctx.deliver(q.ticket, err);
      else
        for (auto uid : q.ids)
          send_result(ctx, st, q.consumer, uid, {}, err);
    }
  }
  return static_cast<int64_t>(queue.size());
}

/// Hands back everything in flight or queued (`pause(abort)`): calls get their rows so far,
/// unfinished ones with stop_reason "abort"; stream requests go to their consumers the same
/// way. Returns how many requests were handed back.
int64_t abort_everything(rank_context& ctx, engine_state& st) {
  int64_t n = 0;
  for (auto id : st.engine->ids()) {
    stop_request(ctx, st, id);
    ++n;
  }
  for (auto& q : st.queue) {
    std::vector<std::vector<sample_output>> rows;
    for (auto& r : q.requests)
      rows.emplace_back(static_cast<size_t>(std::max<int64_t>(1, r.num_samples)),
                        sample_output{{}, {}, "abort", {}, {}, {}, {}});
    n += static_cast<int64_t>(q.requests.size());
    if (q.ticket) {
      std::vector<sample_output> flat;
      for (auto& request_rows : rows)
        for (auto& row : request_rows)
          flat.push_back(std::move(row));
      ctx.deliver(q.ticket, caf::make_message(std::move(flat)));
    } else {
      for (size_t i = 0; i < q.ids.size() && i < rows.size(); ++i)
        send_result(ctx, st, q.consumer, q.ids[i], std::move(rows[i]), {});
    }
  }
  st.queue.clear();
  return n;
}

// -- the step loop --------------------------------------------------------------------------

/// The error of a stream request whose deadline passed.
caf::error timed_out(const engine_state& st, int64_t user_id, int64_t timeout_ms) {
  return make_error(errc::timeout, "engine rank " + std::to_string(st.rank) + ": request " +
                                       std::to_string(user_id) + " did not finish within " +
                                       std::to_string(timeout_ms) + " ms");
}

/// Stops stream requests (running or queued) whose deadline passed; arms a timer for the next
/// one when the engine cannot step (so deadlines hold while paused or asleep).
void enforce_deadlines(rank_context& ctx, engine_state& st, bool can_step) {
  const auto now = clock_type::now();
  std::vector<uint64_t> expired;
  std::optional<clock_type::time_point> next;
  auto note = [&](clock_type::time_point t) {
    if (!next || t < *next)
      next = t;
  };
  for (auto& [id, o] : st.origins) {
    if (o.call != 0)
      continue;
    if (o.deadline <= now)
      expired.push_back(id);
    else
      note(o.deadline);
  }
  for (auto id : expired) {
    const auto& o = st.origins.at(id);
    stop_request(ctx, st, id, timed_out(st, o.user_id, o.timeout_ms));
  }
  for (auto q = st.queue.begin(); q != st.queue.end();) {
    if (q->ticket != 0 || q->deadline > now) {
      if (q->ticket == 0)
        note(q->deadline);
      ++q;
      continue;
    }
    for (size_t i = 0; i < q->ids.size(); ++i)
      send_result(ctx, st, q->consumer, q->ids[i],
                  std::vector<sample_output>(
                      static_cast<size_t>(std::max<int64_t>(1, q->requests[i].num_samples)),
                      sample_output{{}, {}, "abort", {}, {}, {}, {}}),
                  timed_out(st, q->ids[i], q->timeout_ms));
    q = st.queue.erase(q);
  }
  if (st.timer_at && *st.timer_at <= now)
    st.timer_at.reset(); // it fired (this may be its step)
  if (next && !can_step && (!st.timer_at || *next < *st.timer_at)) {
    const auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                       std::chrono::milliseconds(1);
    st.timer_at = now + delay;
    ctx.step_after(delay);
  }
}

/// One forward pass for one weights key (round robin over the keys with work).
bool engine_step(rank_context& ctx) {
  auto& st = state_as<engine_state>(ctx);
  if (!st.engine)
    return false;
  const bool can_step = !st.paused && st.asleep.empty() && st.engine->has_work();
  enforce_deadlines(ctx, st, can_step);
  if (!can_step || !st.engine->has_work())
    return false;
  auto keys = st.engine->keys();
  auto next = std::upper_bound(keys.begin(), keys.end(), st.last_key);
  const int64_t key = next == keys.end() ? keys.front() : *next;
  st.last_key = key;
  const int64_t version = key == 0 ? st.weights.current() : key;
  std::vector<be::engine_output> outputs;
  const auto started = clock_type::now();
  try {
    outputs = st.weights.with(key, [&] { return st.engine->step(key, version); });
    st.busy_seconds += std::chrono::duration<double>(clock_type::now() - started).count();
  } catch (...) {
    // Fail the requests of this key rather than retrying a step that cannot run.
    auto err = current_exception_to_error("engine rank " + std::to_string(st.rank) +
                                          " step on weights version " + std::to_string(version));
    for (auto id : st.engine->ids())
      if (st.origins.count(id) && st.origins.at(id).key == key)
        stop_request(ctx, st, id, err);
  }
  for (auto& out : outputs) {
    const auto id = out.id;
    finish_request(ctx, st, id, to_outputs(std::move(out)));
  }
  st.weights.drop_unused([&](int64_t v) { return version_in_use(st, v); });
  return st.engine->has_work();
}

namespace {

actor_kind make_kind() {
  actor_kind k;
  k.name = "engine";
  k.make_state = [](const rank_info& info) {
    auto st = std::make_unique<engine_state>();
    st->rank = info.rank;
    return st;
  };
  namespace ops = engine_ops;
  k.implements<engine_interface>();
  k.add(typed_op(ops::init_model, init_model)
            .dispatched(op_dispatch::moves(op_residency::everything_on)));
  k.add(typed_op(ops::configure, configure));
  // Sampling needs the weights and the KV cache awake; requests spread over the ranks.
  k.add(typed_op(ops::generate, generate)
            .dispatched(op_dispatch::needs(true, true, op_route::spread_requests)));
  k.add(typed_op(ops::submit, submit, {"consumer", "ids", "", "timeout_ms"})
            .dispatched(op_dispatch::needs(true, true, op_route::stream_requests)));
  k.add(typed_op(ops::cancel, cancel, {"consumer", "ids"})
            .dispatched(op_dispatch::routed(op_route::cancel_streams)));
  k.add(typed_op(ops::sleep, sleep_op, {"tags"})
            .dispatched(op_dispatch::moves(op_residency::tagged_off, "weights", "kv_cache")));
  k.add(typed_op(ops::wake_up, wake_up, {"tags"})
            .dispatched(op_dispatch::moves(op_residency::tagged_on, "weights", "kv_cache")));
  k.add(typed_op(ops::memory, memory));
  k.add(typed_op(ops::pause, pause_op, {"mode: keep | abort"}));
  k.add(typed_op(ops::resume, resume));
  k.add(typed_op(ops::weight_version, weight_version));
  k.add(typed_op(ops::set_weights, set_weights, {"weights", "version"}));
  k.add(typed_op(ops::get_weights, get_weights));
  k.add(typed_op(ops::retain_weights, retain_weights, {"version", "max_retained"}));
  k.add(typed_op(ops::receive_weights, receive_weights));
  k.add(typed_op(ops::stats, stats));
  k.step = engine_step;
  return k;
}

} // namespace

} // namespace engine_detail

void register_engine_kind() {
  register_kind(engine_detail::make_kind());
}

} // namespace rlforge::actors
