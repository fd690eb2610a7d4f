// Declared ops (op_ref, actors/rank_op.hpp): the arguments a call builds through a declaration,
// the answers read back as the declared types, the compile-time match between a declaration and
// the function implementing it, and the kinds built from exactly their declarations.
#include "actors/rank_op.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backends/test_support.hpp"
#include "actors/actor_kind.hpp"
#include "actors/dispatcher.hpp"
#include "actors/engine.hpp"
#include "actors/rank_actor.hpp"
#include "actors/worker.hpp"
#include "runtime/errc.hpp"

using namespace rlforge;
using namespace rlforge::actors;

namespace {

struct counter final : kind_state {
  int64_t total = 0;
};

caf::expected<int64_t> add(rank_context&, counter& st, const int64_t& x,
                           const std::optional<bool>& twice) {
  st.total += twice.value_or(false) ? 2 * x : x;
  return st.total;
}

caf::expected<std::string> wrong_answer(rank_context&, counter&, const int64_t&,
                                        const std::optional<bool>&) {
  return std::string{};
}

caf::expected<int64_t> wrong_argument(rank_context&, counter&, const double&,
                                      const std::optional<bool>&) {
  return 0;
}

constexpr op_ref<int64_t(int64_t, std::optional<bool>)> add_op{"add", caf::atom("add")};

/// True when `typed_op(Ref, Fn)` compiles: a declaration and the function implementing it agree.
template <class Ref, class Fn, class = void> struct declares : std::false_type {};
template <class Ref, class Fn>
struct declares<Ref, Fn,
                std::void_t<decltype(typed_op(std::declval<const Ref&>(), std::declval<Fn>()))>>
    : std::true_type {};

std::set<std::string> names_of(const std::map<caf::atom_value, rank_op>& ops) {
  std::set<std::string> out;
  for (const auto& [id, op] : ops) {
    EXPECT_EQ(id, op.id) << op.name;
    out.insert(op.name);
  }
  return out;
}

} // namespace

TEST(OpRef, OnlyAFunctionOfTheDeclaredTypesImplementsADeclaration) {
  static_assert(declares<decltype(add_op), decltype(&add)>::value);
  static_assert(!declares<decltype(add_op), decltype(&wrong_answer)>::value);
  static_assert(!declares<decltype(add_op), decltype(&wrong_argument)>::value);
  auto op = typed_op(add_op, add, {"x", "twice"});
  EXPECT_EQ(op.name, "add");
  EXPECT_EQ(op.signature, "int64 x[, bool twice]");
  EXPECT_EQ(op.result, "int64");
}

TEST(OpRef, ArgumentsAreBuiltAsTheDeclaredTypes) {
  // Given values convert to the declared types (an int to int64, a literal to std::string), and
  // optional trailing arguments may be left off.
  auto one = add_op.args(5);
  ASSERT_TRUE(one.match_elements<int64_t>());
  EXPECT_EQ(one.get_as<int64_t>(0), 5);
  EXPECT_TRUE((add_op.args(5, true).match_elements<int64_t, bool>()));
  EXPECT_TRUE(rank_ops::ping.args().empty());
  auto load = worker_ops::load_checkpoint.args("/ckpt", 3);
  EXPECT_TRUE((load.match_elements<std::string, int64_t>()));
  // What a declaration builds is what the declared op accepts.
  register_worker_kinds();
  register_engine_kind();
  auto policy = find_kind("policy");
  ASSERT_TRUE(policy);
  const auto& ops = policy->ops;
  EXPECT_TRUE(ops.at(worker_ops::load_checkpoint.id).accepts(load));
  EXPECT_TRUE(ops.at(worker_ops::load_checkpoint.id)
                  .accepts(worker_ops::load_checkpoint.args("/ckpt", 3, "policy", false)));
  EXPECT_TRUE(ops.at(worker_ops::set_lr.id).accepts(worker_ops::set_lr.args(1e-3)));
  EXPECT_TRUE(
      ops.at(worker_ops::offload.id).accepts(worker_ops::offload.args(std::vector<std::string>{})));
  auto engine = find_kind("engine");
  ASSERT_TRUE(engine);
  EXPECT_TRUE(engine->ops.at(engine_ops::pause.id).accepts(engine_ops::pause.args()));
  EXPECT_TRUE(engine->ops.at(engine_ops::pause.id).accepts(engine_ops::pause.args("abort")));
  EXPECT_TRUE(
      engine->ops.at(engine_ops::retain_weights.id).accepts(engine_ops::retain_weights.args(4, 2)));
}

TEST(OpRef, AnswersAreReadAsTheDeclaredTypeOrRefusedNamingTheOp) {
  auto memory = engine_ops::memory.answer(caf::make_message(int64_t{10}, int64_t{20}));
  ASSERT_TRUE(memory);
  EXPECT_EQ(*memory, std::make_tuple(int64_t{10}, int64_t{20}));
  EXPECT_TRUE(rank_ops::ping.answer(caf::message{}));
  auto version = engine_ops::weight_version.answer(caf::make_message(int64_t{7}));
  ASSERT_TRUE(version);
  EXPECT_EQ(*version, 7);

  // Another type, an extra value or a missing one: an internal error naming the op and its
  // declared answer.
  auto expect_refused = [](caf::error err, const std::string& op, const std::string& declared) {
    EXPECT_TRUE(is(err, errc::internal));
    auto text = error_message(err);
    EXPECT_NE(text.find(op), std::string::npos) << text;
    EXPECT_NE(text.find("(" + declared + ")"), std::string::npos) << text;
  };
  expect_refused(engine_ops::memory.answer(caf::make_message(std::string{"x"})).error(), "memory",
                 "int64, int64");
  expect_refused(engine_ops::weight_version.answer(caf::message{}).error(), "weight_version",
                 "int64");
  expect_refused(rank_ops::ping.answer(caf::make_message(int64_t{1})).error(), "ping", "");
  expect_refused(engine_ops::generate.answer(caf::make_message(std::vector<int64_t>{})).error(),
                 "generate", "std::vector<sample_output>");

  // An error passes through unchanged.
  auto failed = engine_ops::weight_version.answer(make_error(errc::timeout, "no answer"));
  ASSERT_FALSE(failed);
  EXPECT_TRUE(is(failed.error(), errc::timeout));

  // Several ranks' answers, in order; one of another type refuses them all.
  std::vector<caf::message> two{caf::make_message(int64_t{1}), caf::make_message(int64_t{2})};
  auto both = engine_ops::resume.answers(two);
  ASSERT_TRUE(both);
  EXPECT_EQ(*both, (std::vector<int64_t>{1, 2}));
  two.push_back(caf::make_message(std::string{"3"}));
  EXPECT_FALSE(engine_ops::resume.answers(two));
}

// No kind answers an op that is not declared, and no declaration lacks its op.
TEST(OpRef, EveryKindIsBuiltFromExactlyItsDeclarations) {
  register_worker_kinds();
  register_engine_kind();
  const std::set<std::string> workers_everywhere{
      worker_ops::init_model.name,     worker_ops::forward.name,
      worker_ops::tinker_forward.name, worker_ops::set_algorithm_config.name,
      worker_ops::save_hf_model.name,  worker_ops::offload.name,
      worker_ops::onload.name,         worker_ops::memory.name,
      worker_ops::send_weights.name};
  std::set<std::string> trainers = workers_everywhere;
  for (const char* name :
       {worker_ops::forward_backward.name, worker_ops::tinker_forward_backward.name,
        worker_ops::optim_step.name, worker_ops::set_lr.name, worker_ops::save_checkpoint.name,
        worker_ops::load_checkpoint.name})
    trainers.insert(name);
  for (const char* kind : {"policy", "critic"}) {
    auto k = find_kind(kind);
    ASSERT_TRUE(k);
    EXPECT_EQ(names_of(k->ops), trainers) << kind;
  }
  auto ref = find_kind("ref");
  ASSERT_TRUE(ref);
  EXPECT_EQ(names_of(ref->ops), workers_everywhere);

  auto engine = find_kind("engine");
  ASSERT_TRUE(engine);
  const std::set<std::string> engine_names{
      engine_ops::init_model.name,      engine_ops::configure.name,
      engine_ops::generate.name,        engine_ops::submit.name,
      engine_ops::cancel.name,          engine_ops::sleep.name,
      engine_ops::wake_up.name,         engine_ops::memory.name,
      engine_ops::pause.name,           engine_ops::resume.name,
      engine_ops::weight_version.name,  engine_ops::set_weights.name,
      engine_ops::get_weights.name,     engine_ops::retain_weights.name,
      engine_ops::receive_weights.name, engine_ops::stats.name};
  EXPECT_EQ(names_of(engine->ops), engine_names);

  const std::set<std::string> builtin_names{rank_ops::info.name,
                                            rank_ops::ping.name,
                                            rank_ops::kind.name,
                                            rank_ops::threads.name,
                                            rank_ops::location.name,
                                            rank_ops::device_memory.name,
                                            rank_ops::init_collective.name,
                                            rank_ops::checkpoint_visible.name,
                                            rank_ops::all_reduce.name,
                                            rank_ops::broadcast.name};
  EXPECT_EQ(names_of(builtin_ops()), builtin_names);

  // The dispatcher's streaming submit is the engine's, less the timeout (the call's own).
  EXPECT_STREQ(dispatcher_ops::submit.name, engine_ops::submit.name);
}

// Each kind is a CAF typed actor whose interface lists its declared ops with their argument
// types, one signature per number of optional arguments given; the reference does not train.
TEST(OpRef, EachKindIsATypedActorOfItsDeclaredOps) {
  using caf::detail::tl_contains;
  using forward_backward = caf::replies_to<caf::atom_constant<worker_ops::forward_backward.id>,
                                           batch_payload, loss_request>::with<op_result>;
  using forward_alone =
      caf::replies_to<caf::atom_constant<worker_ops::forward.id>, batch_payload>::with<op_result>;
  using forward_with_loss = caf::replies_to<caf::atom_constant<worker_ops::forward.id>,
                                            batch_payload, loss_request>::with<op_result>;
  using ping = caf::replies_to<caf::atom_constant<rank_ops::ping.id>>::with<op_result>;
  using trainer = trainer_interface::type::signatures;
  using reference = reference_interface::type::signatures;
  static_assert(tl_contains<trainer, forward_backward>::value);
  static_assert(!tl_contains<reference, forward_backward>::value);
  static_assert(tl_contains<reference, forward_alone>::value);
  static_assert(tl_contains<reference, forward_with_loss>::value);
  static_assert(tl_contains<reference, ping>::value);
  using generate = caf::replies_to<caf::atom_constant<engine_ops::generate.id>,
                                   std::vector<sample_request>>::with<op_result>;
  static_assert(tl_contains<engine_interface::type::signatures, generate>::value);
  static_assert(!tl_contains<trainer, generate>::value);
  // 10 built-in ops, 9 reference ops of which forward has two signatures, two step messages.
  EXPECT_EQ(caf::detail::tl_size<reference>::value, 10u + 10u + 2u);
  EXPECT_EQ(reference_interface::ids().size(), 9u);
}

namespace {

constexpr op_ref<int64_t()> answer_op{"answer", caf::atom("answer")};
constexpr op_ref<int64_t()> other_op{"other", caf::atom("other")};
constexpr op_ref<int64_t()> fake_ping{"not_ping", caf::atom("ping")};
constexpr op_ref<int64_t()> fake_generate{"not_generate", caf::atom("generate")};

caf::expected<int64_t> forty_two(rank_context&) {
  return 42;
}

/// A kind named `name` with the interface `Interface` (none when void) and `ops`.
template <class Interface = void>
actor_kind kind_of(const std::string& name, const std::vector<rank_op>& ops) {
  actor_kind k;
  k.name = name;
  if constexpr (!std::is_void_v<Interface>)
    k.implements<Interface>();
  for (const auto& op : ops)
    k.add(op);
  return k;
}

void expect_refused(const actor_kind& k, const std::vector<std::string>& fragments) {
  backends::testing::expect_error([&] { register_kind(k); }, backends::error_code::internal,
                                  fragments);
}

} // namespace

// register_kind refuses, naming the op, a kind whose op table is not its interface or whose ids
// would make a call ambiguous.
TEST(OpRef, AKindWhoseOpsAreNotItsInterfaceIsRefusedNamingTheOp) {
  register_engine_kind();
  const auto answer = context_op(answer_op, forty_two);
  const auto other = context_op(other_op, forty_two);
  expect_refused(kind_of("test.untyped", {answer}),
                 {"actor kind 'test.untyped'", "no typed interface"});
  expect_refused(kind_of<rank_interface<answer_op, other_op>>("test.missing", {answer}),
                 {"its interface lists op <other> and it has no such op"});
  expect_refused(kind_of<rank_interface<answer_op>>("test.extra", {answer, other}),
                 {"op 'other' <other> is not in its interface"});
  expect_refused(
      kind_of<rank_interface<fake_ping>>("test.builtin", {context_op(fake_ping, forty_two)}),
      {"op 'not_ping' <ping> has the id of a built-in op"});
  expect_refused(
      kind_of<rank_interface<fake_generate>>("test.clash", {context_op(fake_generate, forty_two)}),
      {"op 'not_generate' has the id <generate> of op 'generate'"});
  // None of them was registered; a kind built right is.
  for (const char* name :
       {"test.untyped", "test.missing", "test.extra", "test.builtin", "test.clash"})
    EXPECT_FALSE(find_kind(name)) << name;
  register_kind(kind_of<rank_interface<answer_op>>("test.good", {answer}));
  EXPECT_TRUE(find_kind("test.good"));
  EXPECT_EQ(op_name(answer_op.id), "answer");
}
