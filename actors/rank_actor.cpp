#include "actors/rank_actor.hpp"

#include <caf/all.hpp>

#include "actors/actor_kind.hpp"
#include "actors/backend_seam.hpp"
#include "actors/collective_ops.hpp"
#include "actors/protocol.hpp"
#include "backends/threads.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

struct rank_state {
  actor_kind kind;
  rank_context ctx;
  static const char* name;
};

const char* rank_state::name = "rlforge.rank";

std::string describe(const rank_info& info, const std::string& op) {
  return "group '" + info.group + "' rank " + std::to_string(info.rank) + " op '" + op + "'";
}

caf::expected<caf::message> builtin_op(rank_context& ctx, const std::string& op,
                                       const caf::message& args, bool& handled) {
  handled = true;
  if (op == "info")
    return caf::make_message(ctx.info);
  if (op == "ping")
    return caf::message{};
  if (op == "threads")
    return caf::make_message(static_cast<int32_t>(backends::intra_op_threads()));
  if (op == "init_collective" || op == "all_reduce" || op == "broadcast")
    return run_collective_op(ctx, op, args);
  handled = false;
  return caf::message{};
}

caf::behavior rank_actor(caf::stateful_actor<rank_state>* self, actor_kind kind, rank_info info) {
  auto& st = self->state;
  st.kind = std::move(kind);
  st.ctx.info = std::move(info);
  // Runs on the detached actor's own thread: torch's thread count is per OS thread.
  backends::set_intra_op_threads(std::max(1, st.ctx.info.threads));
  if (st.kind.make_state)
    st.ctx.state = st.kind.make_state(st.ctx.info);
  return {
    [=](call_atom, const std::string& op, const caf::message& args) -> caf::result<op_result> {
      auto& st = self->state;
      auto context = describe(st.ctx.info, op);
      caf::expected<caf::message> out{caf::message{}};
      try {
        bool handled = false;
        out = builtin_op(st.ctx, op, args, handled);
        if (!handled) {
          auto i = st.kind.ops.find(op);
          if (i == st.kind.ops.end()) {
            std::string known = "info, ping, threads, init_collective, all_reduce, broadcast";
            for (auto& [name, _] : st.kind.ops)
              known += ", " + name;
            return make_error(errc::not_found, context + ": kind '" + st.kind.name
                                                 + "' has no such op (ops: " + known + ")");
          }
          out = i->second(st.ctx, args);
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
      if (!out) {
        auto& err = out.error();
        if (err.category() == errc_category) {
          auto msg = error_message(err);
          if (msg.rfind(context, 0) != 0)
            return make_error(static_cast<errc>(err.code()), context + ": " + msg);
        }
        return std::move(err);
      }
      return op_result{std::move(*out)};
    },
  };
}

} // namespace

caf::expected<caf::actor> spawn_rank(caf::actor_system& sys, const std::string& kind,
                                     rank_info info) {
  auto k = find_kind(kind);
  if (!k)
    return std::move(k.error());
  if (info.threads < 1)
    return make_error(errc::invalid_argument, "rank threads must be >= 1, got "
                                                + std::to_string(info.threads));
  return sys.spawn<caf::detached>(rank_actor, std::move(*k), std::move(info));
}

} // namespace rlforge::actors
