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

namespace rank_detail {
const char* rank_state::name = "rlforge.rank";
} // namespace rank_detail

namespace {

using rank_detail::rank_state;

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

/// Queues one step of the kind's background work behind the messages already waiting.
void schedule_step(caf::scheduled_actor* self, rank_state& st) {
  if (!st.kind.step || st.step_queued)
    return;
  st.step_queued = true;
  caf::anon_send(caf::actor_cast<caf::actor>(self), step_atom::value);
}

/// The types of a message's elements from `first` on, "(int64, string)".
std::string element_types(caf::actor_system& sys, const caf::type_erased_tuple& xs,
                          size_t first = 0) {
  std::string out;
  for (size_t i = first; i < xs.size(); ++i)
    out += (i > first ? ", " : "") + sys.types().portable_name(xs.type(i));
  return "(" + out + ")";
}

/// The op `id` names on a rank of `st`'s kind: a built-in op or one of the kind's; null if none.
const rank_op* find_op(const rank_state& st, caf::atom_value id) {
  if (auto b = builtin_ops().find(id); b != builtin_ops().end())
    return &b->second;
  if (auto i = st.kind.ops.find(id); i != st.kind.ops.end())
    return &i->second;
  return nullptr;
}

} // namespace

namespace rank_detail {

void start(caf::scheduled_actor* self, rank_state& st, actor_kind kind, rank_info info) {
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
    caf::send_as(caf::actor_cast<caf::actor>(self), to, std::move(msg));
  };
  st.ctx.step_after = [self](std::chrono::milliseconds delay) {
    caf::delayed_anon_send(caf::actor_cast<caf::actor>(self), delay, step_atom::value, true);
  };
  // A message outside the kind's interface, which CAF would drop with a bare
  // unexpected_message: an op of the kind with other argument types is refused as the op's own
  // check refuses it (invalid_argument, naming its signature); an unknown op or another message
  // is not_found, naming the kind's ops. The rank stays as it was.
  self->set_default_handler(
      [&st](caf::scheduled_actor* self, caf::message_view& x) -> caf::result<caf::message> {
        const auto& xs = x.content();
        auto& sys = self->system();
        const bool has_id = !xs.empty() && xs.type(0).first == caf::type_nr<caf::atom_value>::value;
        if (has_id) {
          if (const auto* op = find_op(st, xs.get_as<caf::atom_value>(0)))
            return make_error(errc::invalid_argument, describe(st.ctx.info, op->name) + ": " +
                                                          op->name + " expects (" + op->signature +
                                                          "), got " + element_types(sys, xs, 1));
        }
        std::string known;
        const std::map<caf::atom_value, rank_op>* tables[] = {&builtin_ops(), &st.kind.ops};
        for (const auto* table : tables)
          for (const auto& [_, op] : *table)
            known += (known.empty() ? "" : ", ") + op.name;
        const auto name = has_id ? op_name(xs.get_as<caf::atom_value>(0)) : std::string{"?"};
        const auto what = has_id ? "op '" + name + "'" : "message " + element_types(sys, xs);
        return make_error(errc::not_found, describe(st.ctx.info, name) + ": kind '" + st.kind.name +
                                               "' has no such " + what + " (ops: " + known + ")");
      });
}

void step(caf::scheduled_actor* self, rank_state& st, bool timer) {
  if (!timer)
    st.step_queued = false;
  bool more = false;
  try {
    more = st.kind.step && st.kind.step(st.ctx);
  } catch (...) {
    auto err = current_exception_to_error(describe(st.ctx.info, "step"));
    runtime::logger("actors.rank")->error("step_failed {}", error_message(err));
  }
  flush_deliveries(st);
  if (more)
    schedule_step(self, st);
}

caf::result<op_result> call(caf::scheduled_actor* self, rank_state& st, caf::atom_value id) {
  const auto* op = find_op(st, id);
  auto context = describe(st.ctx.info, op != nullptr ? op->name : op_name(id));
  if (op == nullptr) // the interface lists every op of the kind; this is our own bug
    return make_error(errc::internal, context + ": kind '" + st.kind.name +
                                          "' lists the op in its interface and has no such op");
  // The call's arguments: the message's elements after the op's id, shared, not copied.
  const auto args = self->current_mailbox_element()->copy_content_to_message().drop(1);
  st.ctx.deferred_ticket.reset();
  caf::expected<caf::message> out{caf::message{}};
  // Results of earlier deferred calls go out after this op, whatever it answers; then the
  // kind's background work (if any) gets its turn.
  auto flush = caf::detail::make_scope_guard([&] {
    flush_deliveries(st);
    schedule_step(self, st);
  });
  try {
    out = op->call(st.ctx, args);
  } catch (...) {
    auto err = current_exception_to_error(context);
    runtime::logger("actors.rank")->warn("op_failed {}", error_message(err));
    return err;
  }
  if (st.ctx.exit_reason) {
    // The op asked the rank to die: quit without answering, like a crashed process.
    runtime::logger("actors.rank")
        ->error("rank_exit {} reason={}", context, self->system().render(st.ctx.exit_reason));
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
}

} // namespace rank_detail

const std::map<caf::atom_value, rank_op>& builtin_ops() {
  static const std::map<caf::atom_value, rank_op> ops = [] {
    std::map<caf::atom_value, rank_op> out;
    for (auto op : {context_op(rank_ops::info, info_op), context_op(rank_ops::ping, ping_op),
                    context_op(rank_ops::kind, kind_op), context_op(rank_ops::threads, threads_op),
                    context_op(rank_ops::location, location_op),
                    context_op(rank_ops::device_memory, device_memory_op),
                    context_op(rank_ops::init_collective, init_collective_op),
                    context_op(rank_ops::all_reduce, all_reduce_op),
                    context_op(rank_ops::broadcast, broadcast_op, {"", "root"}),
                    context_op(rank_ops::checkpoint_visible, checkpoint_visible_op,
                               {"root", "global_step", "role"})})
      out.emplace(op.id, op);
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
  return k->spawn(sys, *k, info);
}

} // namespace rlforge::actors
