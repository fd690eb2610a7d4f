#pragma once
// One operation of a rank kind, declared with its argument and result types (actor_kind.hpp
// holds the table of a kind's ops). Each op of rlforge's kinds is declared once as an `op_ref`
// (name, argument types, answer type; worker.hpp, engine.hpp, rank_actor.hpp), which both the
// kind and its callers use. `typed_op(ref, fn, names)` builds the op from `fn`, whose types must
// be the declared ones; it checks each call's arguments against them before `fn` runs, hands `fn`
// the kind's own state and the arguments by type, and sends its typed answer as the message's
// values. Its text form ("tensor_map weights, int64 version" -> "int64") names the op in errors
// and in the kind's interface, which a cluster compares between its head and a joining node.
//
// Thread safety: a `rank_op` is immutable once built and may be called from any thread; the
// rank actor calls it on the rank's own thread only.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/detail/type_list.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "backends/error.hpp"
#include "runtime/errc.hpp"
#include "runtime/type_registry.hpp"

namespace rlforge::actors {

struct rank_context;

/// Base of every kind's state (`actor_kind::make_state`); each kind derives its own.
struct kind_state {
  virtual ~kind_state() = default;
};

/// The state `ctx` holds (null for a kind without state).
kind_state* state_of(rank_context& ctx);

/// What an op answers: its result values, or an error.
using op_reply = caf::expected<caf::message>;

/// The answer of an op that answers no values (`caf::expected<no_values>`).
struct no_values {};

/// The answer of an op that answers `R` later (`rank_context::defer_reply`, then `deliver` with
/// an R): the op itself returns `caf::expected<answered_later<R>>{}`, which sends nothing.
template <class R> struct answered_later {};

/// An op as the rank actor calls it: the rank's context and the call's arguments in, the answer
/// out. May throw (the rank turns the exception into an error naming group, rank and op).
using op_fn = std::function<op_reply(rank_context&, const caf::message& args)>;

/// How the dispatcher (dispatcher.hpp) spreads one call of an op over a role's ranks.
enum class op_route : uint8_t {
  /// The same call to every rank; the answer is rank 0's (the default).
  every_rank,
  /// The call's batch (a batch_payload) is split over the ranks, shard i to rank i, and their
  /// outputs merged in input order (data parallel).
  split_batch,
  /// The call's checked Tinker request (a tinker::checked_request) is split by datums over the
  /// ranks, consecutive slices of as equal a size as can be (a rank may get none), and their
  /// tinker_pass_results joined in datum order (data parallel).
  split_datums,
  /// Sample requests (std::vector<sample_request>) spread over the live ranks, least loaded
  /// first; the answers joined in request order. A rank that dies takes its share to the others.
  spread_requests,
  /// (consumer, ids, requests): spread as above, each result streamed back through the
  /// dispatcher to the consumer under the consumer's id; answers the rank of each request.
  stream_requests,
  /// (consumer, ids): stops requests streamed through the dispatcher, on the ranks running them.
  cancel_streams,
};

/// What an op leaves on the ranks' devices once it succeeded, kept in the dispatcher's
/// residency record (what it onloads before an op that needs the model or optimizer).
enum class op_residency : uint8_t {
  unchanged,        ///< the default
  everything_on,    ///< model and optimizer state are on the device (init_model)
  tagged_on,        ///< the tags given (all when none) come onto the device (onload, wake_up)
  tagged_off,       ///< the tags given (all when none) leave the device (offload, sleep)
};

/// The enumerator's name ("split_batch", "tagged_off", ...), for errors and tests.
constexpr const char* to_string(op_route r) {
  switch (r) {
  case op_route::every_rank:
    return "every_rank";
  case op_route::split_batch:
    return "split_batch";
  case op_route::split_datums:
    return "split_datums";
  case op_route::spread_requests:
    return "spread_requests";
  case op_route::stream_requests:
    return "stream_requests";
  case op_route::cancel_streams:
    return "cancel_streams";
  }
  return "?";
}
constexpr const char* to_string(op_residency r) {
  switch (r) {
  case op_residency::unchanged:
    return "unchanged";
  case op_residency::everything_on:
    return "everything_on";
  case op_residency::tagged_on:
    return "tagged_on";
  case op_residency::tagged_off:
    return "tagged_off";
  }
  return "?";
}

/// How the dispatcher runs an op of a role, declared with the op: what it makes resident on the
/// ranks first, how it spreads the call over them, and what the op changes on their devices.
struct op_dispatch {
  bool needs_model = false;     ///< the model (an engine's weights) onloaded first
  bool needs_optimizer = false; ///< the optimizer state (an engine's KV cache) onloaded first
  op_route route = op_route::every_rank;
  op_residency residency = op_residency::unchanged;
  /// For tagged_on/off: the tags that name the model and the optimizer state to the op
  /// ("model"/"optimizer" for workers, "weights"/"kv_cache" for engines).
  std::string model_tag, optimizer_tag;

  /// An op that needs the model (and the optimizer state) resident and runs `route`.
  static op_dispatch needs(bool model, bool optimizer, op_route route = op_route::every_rank) {
    op_dispatch d;
    d.needs_model = model;
    d.needs_optimizer = optimizer;
    d.route = route;
    return d;
  }
  /// An op that moves the tagged state on or off the device (tagged_on/off), or puts
  /// everything on (everything_on, no tags).
  static op_dispatch moves(op_residency residency, std::string model_tag = {},
                           std::string optimizer_tag = {}) {
    op_dispatch d;
    d.residency = residency;
    d.model_tag = std::move(model_tag);
    d.optimizer_tag = std::move(optimizer_tag);
    return d;
  }
  /// An op with no needs that runs `route` (e.g. cancel_streams).
  static op_dispatch routed(op_route route) { return needs(false, false, route); }
};

/// One op of a kind: what it takes, as text, how it is called, and how the dispatcher runs it.
struct rank_op {
  /// The op's name, for people: errors, logs and the kind's interface.
  std::string name;
  /// The op's wire identity (its key in the kind's table): the atom a call to it starts with.
  caf::atom_value id = caf::atom("");
  /// "type name, type name[, type name]": the argument list, optional trailing ones bracketed.
  std::string signature;
  /// "type, type": what the op answers ("" for no values; "message" for an op whose answer is
  /// an untyped caf::message).
  std::string result;
  /// True when a call's arguments match the signature (the check `call` makes first).
  std::function<bool(const caf::message& args)> accepts;
  op_fn call;
  op_dispatch dispatch;

  /// This op, with how the dispatcher runs it.
  rank_op dispatched(op_dispatch d) && {
    dispatch = d;
    return std::move(*this);
  }
};

/// `ctx`'s state as `State`, the type its kind's `make_state` created (for a kind's background
/// `step`; ops get it from `typed_op`). Throws `backends::error{internal}` for another type.
template <class State>
State& state_as(rank_context& ctx) {
  auto* s = dynamic_cast<State*>(state_of(ctx));
  if (s == nullptr)
    backends::fail(backends::error_code::internal,
                   "a rank's state is not the type its op or step was declared for");
  return *s;
}

namespace op_detail {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {
  using type = T;
};

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {
  using type = T;
};

/// A type's name as rlforge registers it for the wire, without the namespace.
template <class T>
std::string registered_name() {
  constexpr int i = caf::detail::tl_index_of<runtime::message_types, T>::value;
  static_assert(i >= 0, "an op argument must be a scalar, a string, an actor, a vector of these "
                        "or a type in runtime::message_types");
  std::string name = runtime::message_type_names[i];
  const std::string ns = "rlforge::";
  return name.rfind(ns, 0) == 0 ? name.substr(ns.size()) : name;
}

/// The name of a scalar, string or actor type: as an argument ("int64", "string") or inside a
/// vector ("int64_t", "std::string"); null for any other type.
template <class T>
constexpr const char* builtin_name(bool in_vector) {
  if constexpr (std::is_same_v<T, std::string>)
    return in_vector ? "std::string" : "string";
  else if constexpr (std::is_same_v<T, int64_t>)
    return in_vector ? "int64_t" : "int64";
  else if constexpr (std::is_same_v<T, int32_t>)
    return in_vector ? "int32_t" : "int32";
  else if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_same_v<T, double>)
    return "double";
  else if constexpr (std::is_same_v<T, caf::actor>)
    return "actor";
  else
    return nullptr;
}

/// The name of an argument of type `T` ("int64", "std::vector<std::string>", "tensor_map"), or
/// of a vector's element when `in_vector`.
template <class T>
std::string arg_text(bool in_vector = false) {
  if constexpr (builtin_name<T>(false) != nullptr)
    return builtin_name<T>(in_vector);
  else if constexpr (is_vector<T>::value &&
                     caf::detail::tl_index_of<runtime::message_types, T>::value < 0)
    return "std::vector<" + arg_text<typename is_vector<T>::type>(true) + ">";
  else
    return registered_name<T>();
}

/// The type an argument has in the message (`std::optional<T>` stands for an optional `T`).
template <class T>
using wire_t = typename std::conditional_t<is_optional<T>::value, is_optional<T>,
                                           std::enable_if<true, T>>::type;

template <class... Args>
constexpr std::size_t required_count() {
  constexpr bool optional[] = {is_optional<Args>::value..., false};
  std::size_t n = 0;
  while (n < sizeof...(Args) && !optional[n])
    ++n;
  return n;
}

template <class... Args>
constexpr bool optionals_trail() {
  constexpr bool optional[] = {is_optional<Args>::value..., false};
  for (std::size_t i = 1; i < sizeof...(Args); ++i)
    if (optional[i - 1] && !optional[i])
      return false;
  return true;
}

template <class... Args>
std::string signature_text(const std::vector<std::string>& names) {
  std::vector<std::string> types{arg_text<wire_t<Args>>()...};
  const bool optional[] = {is_optional<Args>::value..., false};
  std::string out;
  for (std::size_t i = 0; i < types.size(); ++i) {
    auto part = types[i] + (i < names.size() && !names[i].empty() ? " " + names[i] : "");
    if (optional[i])
      out += (i == 0 ? "[" : "[, ") + part;
    else
      out += (i == 0 ? "" : ", ") + part;
  }
  for (std::size_t i = 0; i < types.size(); ++i)
    if (optional[i])
      out += "]";
  return out;
}

/// True when `args` holds the first `n` of `Args` (as their wire types), and nothing else.
template <class... Args, std::size_t... Is>
bool matches_first(const caf::message& args, std::size_t n, std::index_sequence<Is...>) {
  if (args.size() != n)
    return false;
  return ((Is >= n || args.match_element<wire_t<Args>>(Is)) && ...);
}

template <class T>
decltype(auto) arg_at(const caf::message& args, std::size_t i) {
  if constexpr (is_optional<T>::value)
    return i < args.size() ? T{args.get_as<typename is_optional<T>::type>(i)} : T{};
  else
    return args.get_as<T>(i);
}

/// An op's typed answer `R` as text and as the message the rank sends: one value, a
/// std::tuple of values, `no_values`, or an untyped caf::message.
/// An op's typed answer `R` as text, as the message the rank sends (`message`) and back from
/// that message (`read`, empty when the message holds other types): one value, a std::tuple of
/// values, `no_values`, an untyped caf::message, or `answered_later<R>` (sent later, as R).
template <class R>
struct result_of {
  static std::string text() { return arg_text<R>(); }
  static caf::message message(R&& r) { return caf::make_message(std::move(r)); }
  static std::optional<R> read(const caf::message& m) {
    if (!m.match_elements<R>())
      return std::nullopt;
    return m.get_as<R>(0);
  }
};
template <>
struct result_of<caf::message> {
  static std::string text() { return "message"; }
  static caf::message message(caf::message&& r) { return std::move(r); }
  static std::optional<caf::message> read(const caf::message& m) { return m; }
};
template <>
struct result_of<no_values> {
  static std::string text() { return ""; }
  static caf::message message(no_values&&) { return caf::message{}; }
  static std::optional<no_values> read(const caf::message& m) {
    return m.empty() ? std::optional<no_values>{no_values{}} : std::nullopt;
  }
};
template <class R> struct result_of<answered_later<R>> {
  static std::string text() { return result_of<R>::text(); }
  static caf::message message(answered_later<R>&&) { return caf::message{}; }
};
template <class... Ts>
struct result_of<std::tuple<Ts...>> {
  static std::string text() {
    std::string out;
    for (const auto& t : {arg_text<Ts>()...})
      out += (out.empty() ? "" : ", ") + t;
    return out;
  }
  static caf::message message(std::tuple<Ts...>&& r) {
    return std::apply([](auto&&... xs) { return caf::make_message(std::move(xs)...); },
                      std::move(r));
  }
  static std::optional<std::tuple<Ts...>> read(const caf::message& m) {
    if (!m.match_elements<Ts...>())
      return std::nullopt;
    return read(m, std::index_sequence_for<Ts...>{});
  }
  template <std::size_t... Is>
  static std::tuple<Ts...> read(const caf::message& m, std::index_sequence<Is...>) {
    return std::tuple<Ts...>{m.get_as<Ts>(Is)...};
  }
};

template <class R>
op_reply to_reply(caf::expected<R>&& r) {
  if (!r)
    return std::move(r.error());
  return result_of<R>::message(std::move(*r));
}

template <class R, class State, class... Args, std::size_t... Is>
op_reply call_with_state(caf::expected<R> (*fn)(rank_context&, State&, const Args&...),
                         rank_context& ctx, const caf::message& args, std::index_sequence<Is...>) {
  return to_reply(fn(ctx, state_as<State>(ctx), arg_at<Args>(args, Is)...));
}

template <class R, class... Args, std::size_t... Is>
op_reply call_with_context(caf::expected<R> (*fn)(rank_context&, const Args&...),
                           rank_context& ctx, const caf::message& args,
                           std::index_sequence<Is...>) {
  return to_reply(fn(ctx, arg_at<Args>(args, Is)...));
}

/// The op `call(ctx, args)`, after a check that `args` holds `Args` (optional ones may be
/// left off the end).
template <class R, class... Args, class Call>
rank_op make(const char* op, caf::atom_value id, std::vector<std::string> names, Call call) {
  static_assert(optionals_trail<Args...>(), "optional arguments come last");
  rank_op out;
  out.name = op;
  out.id = id;
  out.signature = signature_text<Args...>(names);
  out.result = result_of<R>::text();
  const std::string expects = std::string{op} + " expects (" + out.signature + "), got ";
  out.accepts = [](const caf::message& args) {
    for (std::size_t n = required_count<Args...>(); n <= sizeof...(Args); ++n)
      if (matches_first<Args...>(args, n, std::index_sequence_for<Args...>{}))
        return true;
    return false;
  };
  out.call = [call, expects, accepts = out.accepts](rank_context& ctx,
                                                    const caf::message& args) -> op_reply {
    if (!accepts(args))
      backends::fail(backends::error_code::invalid_argument, expects + caf::to_string(args));
    return call(ctx, args);
  };
  return out;
}

} // namespace op_detail

/// An op's name, wire identity and the types of its arguments and of its answer,
/// `op_ref<R(Args...)>{name, id}`, where Args and R are as `typed_op` reads them from the op's
/// function (a `std::optional<T>` argument is an optional trailing T). Each op has one, declared
/// next to its kind (`worker_ops` in worker.hpp, `engine_ops` in engine.hpp, `rank_ops` in
/// rank_actor.hpp, `dispatcher_ops` in dispatcher.hpp), and both sides of a call use it:
///  - the kind builds the op from it: `typed_op(ref, fn)` does not compile unless `fn` takes
///    Args and answers R (or `answered_later<R>`);
///  - the kind's typed interface lists it (`rank_interface`, rank_interface.hpp):
///    `replies_to<atom_constant<id>, Args...>::with<op_result>`, once per number of optional
///    arguments given;
///  - a caller builds the call with `call(...)` or its arguments with `args(...)` (checked
///    against Args when it compiles) and reads the answer with `answer(...)` (checked against R
///    when it arrives).
/// So an op's name, id and types are written once, and no caller spells them. The id is a CAF
/// atom (at most 10 characters); within a kind and the built-in ops each id names one op, and
/// across kinds one id names ops of one name (`register_kind` checks both).
///
/// Thread safety: a constant; its members are pure.
template <class Signature> struct op_ref;

template <class R, class... Args> struct op_ref<R(Args...)> {
  static_assert(op_detail::optionals_trail<Args...>(), "optional arguments come last");
  const char* name;
  caf::atom_value id;

  /// One call as a rank receives it: the op's id, then the arguments as `args` takes them.
  template <class... Given> caf::message call(Given&&... given) const {
    return caf::message::concat(caf::make_message(id), args(std::forward<Given>(given)...));
  }

  /// The arguments of one call: every required argument, then none, some or all of the optional
  /// ones, each given as (or convertible to) its declared type.
  template <class... Given> caf::message args(Given&&... given) const {
    constexpr std::size_t n = sizeof...(Given);
    static_assert(n >= op_detail::required_count<Args...>() && n <= sizeof...(Args),
                  "a call gives every required argument of the op and at most all of them");
    if constexpr (n == 0)
      return caf::message{};
    else
      return make_args(std::index_sequence_for<Given...>{}, std::forward<Given>(given)...);
  }

  /// The answer of a call as R; an error naming the op when it holds other types.
  caf::expected<R> answer(caf::expected<caf::message> m) const {
    if (!m)
      return std::move(m.error());
    if (auto r = op_detail::result_of<R>::read(*m))
      return std::move(*r);
    return make_error(errc::internal, std::string{name} + " answered " + caf::to_string(*m) +
                                          ", not its declared (" + op_detail::result_of<R>::text() +
                                          ")");
  }

  /// The answers of a call to several ranks, in rank order, each read as R; an error naming the
  /// op when one holds other types.
  caf::expected<std::vector<R>> answers(caf::expected<std::vector<caf::message>> ms) const {
    if (!ms)
      return std::move(ms.error());
    std::vector<R> out;
    out.reserve(ms->size());
    for (auto& m : *ms) {
      auto r = answer(std::move(m));
      if (!r)
        return std::move(r.error());
      out.push_back(std::move(*r));
    }
    return out;
  }

private:
  template <std::size_t... Is, class... Given>
  static caf::message make_args(std::index_sequence<Is...>, Given&&... given) {
    return caf::make_message(
        static_cast<op_detail::wire_t<std::tuple_element_t<Is, std::tuple<Args...>>>>(
            std::forward<Given>(given))...);
  }
};

/// The op `ref` declares, implemented by `fn(ctx, state, args...)` for a kind whose state is
/// `State`; `fn` must take the declared arguments and answer the declared type, now or later
/// (`answered_later<R>`). `names` names the arguments in the signature text (in order; fewer
/// names leave the rest unnamed). A `std::optional<T>` argument is an optional trailing `T`:
/// absent from the call, it is empty. R is one value, a std::tuple of values, `no_values`, or (for
/// an answer whose types vary) a caf::message; the op's `result` text names it.
template <class R, class State, class... Args>
rank_op typed_op(const op_ref<R(Args...)>& ref,
                 caf::expected<R> (*fn)(rank_context&, State&, const Args&...),
                 std::vector<std::string> names = {}) {
  return op_detail::make<R, Args...>(
      ref.name, ref.id, std::move(names), [fn](rank_context& ctx, const caf::message& args) {
        return op_detail::call_with_state(fn, ctx, args, std::index_sequence_for<Args...>{});
      });
}
template <class R, class State, class... Args>
rank_op typed_op(const op_ref<R(Args...)>& ref,
                 caf::expected<answered_later<R>> (*fn)(rank_context&, State&, const Args&...),
                 std::vector<std::string> names = {}) {
  return op_detail::make<answered_later<R>, Args...>(
      ref.name, ref.id, std::move(names), [fn](rank_context& ctx, const caf::message& args) {
        return op_detail::call_with_state(fn, ctx, args, std::index_sequence_for<Args...>{});
      });
}

/// The op `ref` declares, implemented by `fn(ctx, args...)`, which needs no kind state (the
/// built-in ops of every rank).
template <class R, class... Args>
rank_op context_op(const op_ref<R(Args...)>& ref,
                   caf::expected<R> (*fn)(rank_context&, const Args&...),
                   std::vector<std::string> names = {}) {
  return op_detail::make<R, Args...>(
      ref.name, ref.id, std::move(names), [fn](rank_context& ctx, const caf::message& args) {
        return op_detail::call_with_context(fn, ctx, args, std::index_sequence_for<Args...>{});
      });
}

} // namespace rlforge::actors
