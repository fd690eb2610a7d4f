#pragma once
// The typed CAF interface of a rank kind, generated from its ops' declarations (op_ref,
// rank_op.hpp), and the spawning of ranks that implement it.
//
// `rank_interface<ops::a, ops::b, ...>::type` is a `caf::typed_actor` that lists, for each op
// the kind declares and for each built-in op of every rank (`rank_ops`, rank_actor.hpp):
//
//     replies_to<atom_constant<op.id>, Args...>::with<op_result>
//
// once per number of optional arguments a call may give, plus the two step messages a rank with
// background work sends itself. So a kind's interface is its ops' ids and argument types, written
// once (in the op_ref), and CAF refuses a call whose types are not among them before the rank
// looks at it. A call's answer is the op's declared type inside `op_result`, read back with
// `op_ref::answer`.
//
// A kind names its interface when it is built (`actor_kind::implements`); `register_kind` then
// checks that the kind's op table and its interface list the same ops.
//
// Thread safety: types and pure functions only.
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/detail/type_list.hpp>
#include <caf/replies_to.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_behavior.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/actor_kind.hpp"
#include "actors/rank_actor.hpp"
#include "actors/rank_op.hpp"

namespace rlforge::actors {

namespace interface_detail {

/// One signature of an op: its atom and the wire types of the arguments given.
template <class Atom, class... Ts> struct op_signature {
  using mpi = typename caf::replies_to<Atom, Ts...>::template with<op_result>;

  /// The rank's handler of this signature: runs the op the atom names on the call's arguments.
  struct handler {
    caf::scheduled_actor* self;
    rank_detail::rank_state* st;
    caf::result<op_result> operator()(Atom, const Ts&...) const {
      return rank_detail::call(self, *st, Atom::value);
    }
  };
};

template <class Atom, class Tuple, class Index> struct prefix_signature;
template <class Atom, class Tuple, std::size_t... Is>
struct prefix_signature<Atom, Tuple, std::index_sequence<Is...>> {
  using type = op_signature<Atom, std::tuple_element_t<Is, Tuple>...>;
};

template <class Ref> struct ref_signatures;
template <class R, class... Args> struct ref_signatures<op_ref<R(Args...)>> {
  static constexpr std::size_t required = op_detail::required_count<Args...>();
  using wire_args = std::tuple<op_detail::wire_t<Args>...>;

  template <class Atom, std::size_t... Ks>
  static auto make(std::index_sequence<Ks...>) -> caf::detail::type_list<
      typename prefix_signature<Atom, wire_args, std::make_index_sequence<required + Ks>>::type...>;
};

/// Every signature of the op `Ref` (one per number of optional arguments given).
template <const auto& Ref> struct signatures_of {
  using ref_type = std::remove_cv_t<std::remove_reference_t<decltype(Ref)>>;
  using traits = ref_signatures<ref_type>;
  using type = decltype(traits::template make<caf::atom_constant<Ref.id>>(
      std::make_index_sequence<std::tuple_size_v<typename traits::wire_args> - traits::required +
                               1>{}));
};

template <class List> struct typed_of;
template <class... Sigs> struct typed_of<caf::detail::type_list<Sigs...>> {
  using type = caf::typed_actor<typename Sigs::mpi..., caf::reacts_to<step_atom>,
                                caf::reacts_to<step_atom, bool>>;

  template <class Self> static typename type::behavior_type behavior(Self* self) {
    auto* st = &self->state;
    return {typename Sigs::handler{self, st}...,
            [self, st](step_atom) { rank_detail::step(self, *st, false); },
            [self, st](step_atom, bool) { rank_detail::step(self, *st, true); }};
  }
};

template <const auto&... Refs>
using signature_list =
    caf::detail::tl_concat_t<caf::detail::type_list<>, typename signatures_of<Refs>::type...>;

} // namespace interface_detail

/// The typed interface of a kind whose ops are `Refs` (op_ref constants), with the built-in ops
/// of every rank; and the spawning of its ranks.
template <const auto&... Refs> struct rank_interface {
  using signatures = interface_detail::signature_list<
      rank_ops::info, rank_ops::ping, rank_ops::kind, rank_ops::threads, rank_ops::location,
      rank_ops::device_memory, rank_ops::init_collective, rank_ops::checkpoint_visible,
      rank_ops::all_reduce, rank_ops::broadcast, Refs...>;
  using typed = interface_detail::typed_of<signatures>;
  /// The kind's typed actor handle.
  using type = typename typed::type;

  /// The ids of the kind's own ops (not the built-in ones), in declaration order.
  static std::vector<caf::atom_value> ids() { return {Refs.id...}; }

  /// A rank of `kind` as a detached actor of this interface (see `spawn_rank`).
  static caf::actor spawn(caf::actor_system& sys, const actor_kind& kind, const rank_info& info) {
    return caf::actor_cast<caf::actor>(sys.spawn<caf::detached>(&behavior, kind, info));
  }

private:
  static typename type::behavior_type
  behavior(typename type::template stateful_pointer<rank_detail::rank_state> self, actor_kind kind,
           rank_info info) {
    rank_detail::start(self, self->state, std::move(kind), std::move(info));
    return typed::behavior(self);
  }
};

} // namespace rlforge::actors
