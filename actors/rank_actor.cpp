#include "actors/rank_actor.hpp"

#include <map>
#include <utility>

#include <caf/all.hpp>
#include <caf/detail/scope_guard.hpp>

#include "actors/actor_kind.hpp"
#include "actors/backend_seam.hpp"
#include "actors/checkpoint_probe.hpp"
#include "actors/collective_ops.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_device.hpp"
#include "actors/weight_sync.hpp"
#include "backends/devices.hpp"
#include "backends/threads.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

struct rank_state {
  actor_kind kind;
  rank_context ctx;
  /// Calls answered later (`rank_context::defer_reply`): ticket → (promise, error context).
  std::map<uint64_t, std::pair<caf::typed_response_promise<op_result>, std::string>> deferred;
  /// A step message is in the mailbox (at most one at a time).
  bool step_queued = false;
  static const char* name;
};

const char* rank_state::name = "rlforge.rank";

std::string describe(const rank_info& info, const std::string& op) {
  return "group '" + info.group + "' rank " + std::to_string(info.rank) + " op '" + op + "'";
}

caf::expected<rank_info> info_op(rank_context& ctx) {
  return ctx.info;
}

caf::expected<std::string> kind_op(rank_context& ctx) {
  return ctx.kind;
}

caf::expected<no_values> ping_op(rank_context&) {
  return no_values{};
}

caf::expected<int32_t> threads_op(rank_context&) {
  return static_cast<int32_t>(backends::intra_op_threads());
}

caf::expected<std::tuple<std::string, int64_t, std::string, std::string>> location_op(rank_context& ctx) {
  auto here = this_process();
  return std::make_tuple(here.host, here.pid, here.address, compute_device(ctx.info).str());
}

caf::expected<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> device_memory_op(rank_context& ctx) {
  // The rank's CUDA device as its process's caching allocator and the driver see it.
  auto m = backends::cuda_memory(compute_device(ctx.info));
  return std::make_tuple(m.allocated, m.reserved, m.peak_allocated, m.free, m.total);
}

/// Adds the rank's context to an `errc` error that does not start with it yet.
caf::error with_context(caf::error err, const std::string& context) {
  if (err.category() == errc_category) {
    auto msg = error_message(err);
    if (msg.rfind(context, 0) != 0)
      return make_error(static_cast<errc>(err.code()), context + ": " + msg);
  }
  return err;
}

/// Sends the results ops delivered for earlier deferred calls.
void flush_deliveries(rank_state& st) {
  auto deliveries = std::move(st.ctx.deliveries);
  st.ctx.deliveries.clear();
  for (auto& [ticket, result] : deliveries) {
    auto i = st.deferred.find(ticket);
    if (i == st.deferred.end()) {
      runtime::logger("actors.rank")->warn("deliver_unknown_ticket {}", ticket);
      continue;
    }
    auto& [promise, context] = i->second;
    if (result)
      promise.deliver(op_result{std::move(*result)});
    else
      promise.deliver(with_context(std::move(result.error()), context));
    st.deferred.erase(i);
  }
}

using rank_ptr = rank_actor::stateful_pointer<rank_state>;

/// Queues one step of the kind's background work behind the messages already waiting.
void schedule_step(rank_ptr self) {
  auto& st = self->state;
  if (!st.kind.step || st.step_queued)
    return;
  st.step_queued = true;
  self->send(self, step_atom::value);
}

rank_actor::behavior_type rank_behavior(rank_ptr self, actor_kind kind, rank_info info) {
  auto& st = self->state;
  st.kind = std::move(kind);
  st.ctx.info = std::move(info);
  st.ctx.kind = st.kind.name;
  // Runs on the detached actor's own thread: torch's thread count is per OS thread, and so is
  // the current CUDA device. A bundle's GPU that this process sees is a real one.
  backends::set_intra_op_threads(std::max(1, st.ctx.info.threads));
  const auto device = backends::rank_device(st.ctx.info.device_ids);
  st.ctx.info.virtual_gpu = device.is_cpu();
  backends::bind_thread_to(device);
  if (st.kind.make_state)
    st.ctx.state = st.kind.make_state(st.ctx.info);
  // The rank is typed and its consumers (stream results) are not: send() refuses that pairing
  // at compile time, so send unchecked, with the rank as the sender.
  st.ctx.send = [self](const caf::actor& to, caf::message msg) {
    // As the rank, but through its dynamically typed handle: the consumers of these messages
    // (e.g. a dispatcher forwarding an engine's results) are not typed actors.
    caf::send_as(caf::actor_cast<caf::actor>(self), to, std::move(msg));
  };
  st.ctx.step_after = [self](std::chrono::milliseconds delay) {
    self->delayed_send(self, delay, step_atom::value, true);
  };
  auto run_step = [self] {
    auto& st = self->state;
    bool more = false;
    try {
      more = st.kind.step && st.kind.step(st.ctx);
    } catch (...) {
      auto err = current_exception_to_error(describe(st.ctx.info, "step"));
      runtime::logger("actors.rank")->error("step_failed {}", error_message(err));
    }
    flush_deliveries(st);
    if (more)
      schedule_step(self);
  };
  return {
    [=](step_atom) {
      self->state.step_queued = false;
      run_step();
    },
    [=](step_atom, bool /* timer */) { run_step(); },
    [=](call_atom, const std::string& op, const caf::message& args) -> caf::result<op_result> {
      auto& st = self->state;
      auto context = describe(st.ctx.info, op);
      st.ctx.deferred_ticket.reset();
      caf::expected<caf::message> out{caf::message{}};
      // Results of earlier deferred calls go out after this op, whatever it answers; then the
      // kind's background work (if any) gets its turn.
      auto flush = caf::detail::make_scope_guard([&] {
        flush_deliveries(st);
        schedule_step(self);
      });
      try {
        const auto& builtins = builtin_ops();
        auto b = builtins.find(op);
        auto i = st.kind.ops.find(op);
        if (b != builtins.end()) {
          out = b->second.call(st.ctx, args);
        } else if (i != st.kind.ops.end()) {
          out = i->second.call(st.ctx, args);
        } else {
          std::string known;
          const std::map<std::string, rank_op>* tables[] = {&builtins, &st.kind.ops};
          for (const auto* table : tables)
            for (auto& [name, _] : *table)
              known += (known.empty() ? "" : ", ") + name;
          return make_error(errc::not_found, context + ": kind '" + st.kind.name
                                               + "' has no such op (ops: " + known + ")");
        }
      } catch (...) {
        auto err = current_exception_to_error(context);
        runtime::logger("actors.rank")->warn("op_failed {}", error_message(err));
        return err;
      }
      if (st.ctx.exit_reason) {
        // The op asked the rank to die: quit without answering, like a crashed process.
        runtime::logger("actors.rank")->error("rank_exit {} reason={}", context,
                                              self->system().render(st.ctx.exit_reason));
        auto promise = self->make_response_promise<op_result>();
        self->quit(st.ctx.exit_reason);
        return promise;
      }
      if (st.ctx.deferred_ticket) {
        // The op answers later (`deliver`); an op that deferred and then failed answers now.
        auto ticket = *st.ctx.deferred_ticket;
        st.ctx.deferred_ticket.reset();
        if (out) {
          auto promise = self->make_response_promise<op_result>();
          st.deferred.emplace(ticket, std::make_pair(promise, context));
          return promise;
        }
      }
      if (!out)
        return with_context(std::move(out.error()), context);
      return op_result{std::move(*out)};
    },
  };
}

} // namespace

const std::map<std::string, rank_op>& builtin_ops() {
  static const std::map<std::string, rank_op> ops = [] {
    std::map<std::string, rank_op> out;
    for (auto op : {context_op(rank_ops::info, info_op), context_op(rank_ops::ping, ping_op),
                    context_op(rank_ops::kind, kind_op), context_op(rank_ops::threads, threads_op),
                    context_op(rank_ops::location, location_op),
                    context_op(rank_ops::device_memory, device_memory_op),
                    context_op(rank_ops::init_collective, init_collective_op),
                    context_op(rank_ops::all_reduce, all_reduce_op),
                    context_op(rank_ops::broadcast, broadcast_op, {"", "root"}),
                    context_op(rank_ops::checkpoint_visible, checkpoint_visible_op,
                               {"root", "global_step", "role"})})
      out.emplace(op.name, op);
    return out;
  }();
  return ops;
}

caf::expected<caf::actor> spawn_rank(caf::actor_system& sys, const std::string& kind,
                                     rank_info info) {
  auto k = find_kind(kind);
  if (!k)
    return std::move(k.error());
  if (info.threads < 1)
    return make_error(errc::invalid_argument, "rank threads must be >= 1, got "
                                                + std::to_string(info.threads));
  return caf::actor_cast<caf::actor>(
    sys.spawn<caf::detached>(rank_behavior, std::move(*k), std::move(info)));
}

} // namespace rlforge::actors
