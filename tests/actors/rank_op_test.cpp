// Typed rank ops (actors/rank_op.hpp): the signature text an op declares, the argument check
// each call passes before the op runs, optional trailing arguments, the kind state the op gets,
// and the interface lines a cluster compares.
#include "actors/rank_op.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "actors/actor_kind.hpp"
#include "actors/engine.hpp"
#include "actors/worker.hpp"
#include "../backends/test_support.hpp"

using namespace rlforge;
using namespace rlforge::actors;

namespace {

struct tally final : kind_state {
  int64_t total = 0;
  std::vector<std::string> seen;
};

struct other_state final : kind_state {};

op_reply add(rank_context&, tally& st, const int64_t& x, const std::optional<std::string>& note,
           const std::optional<bool>& twice) {
  st.total += twice.value_or(false) ? 2 * x : x;
  st.seen.push_back(note.value_or("-"));
  return caf::make_message(st.total);
}

op_reply requests(rank_context&, tally& st, const std::vector<sample_request>& rs,
                const caf::actor&) {
  st.total += static_cast<int64_t>(rs.size());
  return caf::message{};
}

op_reply nothing(rank_context& ctx) {
  return caf::make_message(ctx.info.rank);
}

// The test ops' declarations: name, wire id and types.
constexpr op_ref<caf::message(int64_t, std::optional<std::string>, std::optional<bool>)> add_op{
    "add", caf::atom("add")};
constexpr op_ref<caf::message(std::vector<sample_request>, caf::actor)> requests_op{
    "requests", caf::atom("requests")};
constexpr op_ref<caf::message()> nothing_op{"nothing", caf::atom("nothing")};

rank_context context_with(std::unique_ptr<kind_state> state) {
  rank_context ctx;
  ctx.info.rank = 3;
  ctx.state = std::move(state);
  return ctx;
}

} // namespace

TEST(RankOp, SignatureTextNamesTypesAndBracketsOptionalArguments) {
  EXPECT_EQ(typed_op(add_op, add, {"x", "note", "twice"}).signature,
            "int64 x[, string note[, bool twice]]");
  EXPECT_EQ(typed_op(add_op, add).signature, "int64[, string[, bool]]");
  EXPECT_EQ(typed_op(requests_op, requests, {"", "consumer"}).signature,
            "std::vector<sample_request>, actor consumer");
  EXPECT_EQ(context_op(nothing_op, nothing).signature, "");
}

TEST(RankOp, CallsGetTheirArgumentsByTypeAndOptionalOnesMayBeLeftOff) {
  auto op = typed_op(add_op, add, {"x", "note", "twice"});
  auto ctx = context_with(std::make_unique<tally>());
  auto one = op.call(ctx, caf::make_message(int64_t{5}));
  ASSERT_TRUE(one);
  EXPECT_EQ(one->get_as<int64_t>(0), 5);
  auto two = op.call(ctx, caf::make_message(int64_t{5}, std::string{"n"}));
  ASSERT_TRUE(two);
  EXPECT_EQ(two->get_as<int64_t>(0), 10);
  auto three = op.call(ctx, caf::make_message(int64_t{5}, std::string{"m"}, true));
  ASSERT_TRUE(three);
  EXPECT_EQ(three->get_as<int64_t>(0), 20);
  auto& st = dynamic_cast<tally&>(*ctx.state);
  EXPECT_EQ(st.seen, (std::vector<std::string>{"-", "n", "m"}));
  auto rank = context_op(nothing_op, nothing).call(ctx, caf::message{});
  ASSERT_TRUE(rank);
  EXPECT_EQ(rank->get_as<int32_t>(0), 3);
}

TEST(RankOp, WrongArgumentsAreRefusedBeforeTheOpRunsNamingTheSignature) {
  auto op = typed_op(add_op, add, {"x", "note", "twice"});
  auto ctx = context_with(std::make_unique<tally>());
  const std::vector<caf::message> bad = {
      caf::message{},                                          // a required argument missing
      caf::make_message(std::string{"5"}),                     // the wrong type
      caf::make_message(int64_t{5}, true),                     // an optional one out of order
      caf::make_message(int64_t{5}, std::string{"n"}, true, 1) // one too many
  };
  for (const auto& args : bad)
    backends::testing::expect_error([&] { (void)op.call(ctx, args); },
                                    {"add expects (int64 x[, string note[, bool twice]]), got"});
  EXPECT_EQ(dynamic_cast<tally&>(*ctx.state).total, 0); // nothing ran
  backends::testing::expect_error(
      [&] { (void)context_op(nothing_op, nothing).call(ctx, caf::make_message(1)); },
      {"nothing expects (), got"});
}

TEST(RankOp, AnOpDeclaredForAnotherKindsStateIsAnInternalError) {
  auto op = typed_op(add_op, add);
  auto wrong = context_with(std::make_unique<other_state>());
  backends::testing::expect_error([&] { (void)op.call(wrong, caf::make_message(int64_t{1})); },
                                  backends::error_code::internal, {"not the type"});
  auto none = context_with(nullptr);
  backends::testing::expect_error([&] { (void)op.call(none, caf::make_message(int64_t{1})); },
                                  backends::error_code::internal, {"not the type"});
}

TEST(RankOp, KindInterfacesListEveryOpWithItsSignatureAndResult) {
  register_worker_kinds();
  register_engine_kind();
  auto lines = kind_interfaces();
  EXPECT_TRUE(std::is_sorted(lines.begin(), lines.end()));
  auto has = [&](const std::string& line) {
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  };
  EXPECT_TRUE(has("engine"));
  EXPECT_TRUE(has("engine.set_weights<set_wts>(tensor_map weights, int64 version) -> ()"));
  EXPECT_TRUE(has("engine.pause<pause>([string mode: keep | abort]) -> (int64)"));
  EXPECT_TRUE(has("engine.memory<memory>() -> (int64, int64)"));
  EXPECT_TRUE(has("engine.retain_weights<retain_wts>(int64 version, int64 max_retained) -> "
                  "(std::vector<int64_t>)"));
  // generate answers later, through the rank's deliveries, with its declared type.
  EXPECT_TRUE(has(
      "engine.generate<generate>(std::vector<sample_request>) -> (std::vector<sample_output>)"));
  EXPECT_TRUE(has("policy.forward<forward>(batch_payload[, loss_request]) -> (batch_result)"));
  EXPECT_TRUE(
      has("policy.load_checkpoint<load_ckpt>(string root, int64 global_step[, string role[, bool "
          "with_optimizer]]) -> (int64)"));
  EXPECT_TRUE(has("ref.forward<forward>(batch_payload[, loss_request]) -> (batch_result)"));
  EXPECT_TRUE(
      has("critic.tinker_forward_backward<tk_fwd_bwd>(checked_request) -> (tinker_pass_result)"));
  EXPECT_TRUE(has("ref.tinker_forward<tk_fwd>(checked_request) -> (tinker_pass_result)"));
  EXPECT_FALSE(
      has("ref.tinker_forward_backward<tk_fwd_bwd>(checked_request) -> (tinker_pass_result)"));
  EXPECT_FALSE(has(
      "ref.optim_step<optim_step>(adam_params) -> (optim_result)")); // the reference does not train
  EXPECT_TRUE(has("policy.optim_step<optim_step>(adam_params) -> (optim_result)"));
  EXPECT_TRUE(has("rank.broadcast<broadcast>(std::vector<tensor_blob>, int32 root) -> "
                  "(std::vector<tensor_blob>)"));
  EXPECT_TRUE(
      has("rank.checkpoint_visible<ckpt_vis>(string root, int64 global_step, string role) -> ()"));
  EXPECT_TRUE(has("rank.location<location>() -> (string, int64, string, string)"));
}

// An op's typed answer is the message the rank sends: one value, a tuple's values in order, or
// none.
TEST(RankOp, TypedAnswersBecomeTheirValues) {
  static constexpr op_ref<int64_t()> one_op{"one", caf::atom("one")};
  static constexpr op_ref<std::tuple<int64_t, std::string>()> two_op{"two", caf::atom("two")};
  static constexpr op_ref<no_values()> none_op{"none", caf::atom("none")};
  static constexpr op_ref<int64_t()> refused_op{"refused", caf::atom("refused")};
  auto one = context_op(
      one_op, +[](rank_context&) -> caf::expected<int64_t> { return 7; });
  auto two = context_op(
      two_op, +[](rank_context&) -> caf::expected<std::tuple<int64_t, std::string>> {
        return std::make_tuple(int64_t{3}, std::string{"x"});
      });
  auto none = context_op(
      none_op, +[](rank_context&) -> caf::expected<no_values> { return no_values{}; });
  auto refused = context_op(
      refused_op, +[](rank_context&) -> caf::expected<int64_t> {
        return caf::make_error(caf::sec::unexpected_message);
      });
  EXPECT_EQ(one.result, "int64");
  EXPECT_EQ(two.result, "int64, string");
  EXPECT_EQ(none.result, "");
  auto ctx = context_with(nullptr);
  auto a = one.call(ctx, caf::message{});
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->match_elements<int64_t>());
  EXPECT_EQ(a->get_as<int64_t>(0), 7);
  auto b = two.call(ctx, caf::message{});
  ASSERT_TRUE(b);
  ASSERT_TRUE((b->match_elements<int64_t, std::string>()));
  EXPECT_EQ(b->get_as<std::string>(1), "x");
  auto c = none.call(ctx, caf::message{});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->empty());
  EXPECT_FALSE(refused.call(ctx, caf::message{}));
}

// How the dispatcher runs each op is declared with the op (dispatcher tests cover the routing
// itself: data-parallel shards, onload before a pass, engines woken before sampling).
TEST(RankOp, KindsDeclareHowTheDispatcherRunsTheirOps) {
  register_worker_kinds();
  register_engine_kind();
  auto policy = find_kind("policy");
  auto engine = find_kind("engine");
  ASSERT_TRUE(policy);
  ASSERT_TRUE(engine);
  // "<needs model><needs optimizer> <route> <residency>[ <model tag>/<optimizer tag>]"
  auto of = [](const actor_kind& k, caf::atom_value op) {
    const auto& d = k.ops.at(op).dispatch;
    auto out = std::to_string(d.needs_model) + std::to_string(d.needs_optimizer) + " " +
               to_string(d.route) + " " + to_string(d.residency);
    if (!d.model_tag.empty() || !d.optimizer_tag.empty())
      out += " " + d.model_tag + "/" + d.optimizer_tag;
    return out;
  };
  EXPECT_EQ(of(*policy, worker_ops::forward.id), "10 split_batch unchanged");
  EXPECT_EQ(of(*policy, worker_ops::forward_backward.id), "11 split_batch unchanged");
  EXPECT_EQ(of(*policy, worker_ops::tinker_forward.id), "10 split_datums unchanged");
  EXPECT_EQ(of(*policy, worker_ops::tinker_forward_backward.id), "11 split_datums unchanged");
  EXPECT_EQ(of(*policy, worker_ops::save_hf_model.id), "10 every_rank unchanged");
  EXPECT_EQ(of(*policy, worker_ops::save_checkpoint.id), "11 every_rank unchanged");
  EXPECT_EQ(of(*policy, worker_ops::load_checkpoint.id), "11 every_rank unchanged");
  EXPECT_EQ(of(*policy, worker_ops::optim_step.id), "00 every_rank unchanged");
  EXPECT_EQ(of(*policy, worker_ops::init_model.id), "00 every_rank everything_on");
  EXPECT_EQ(of(*policy, worker_ops::offload.id), "00 every_rank tagged_off model/optimizer");
  EXPECT_EQ(of(*policy, worker_ops::onload.id), "00 every_rank tagged_on model/optimizer");
  EXPECT_EQ(of(*engine, engine_ops::init_model.id), "00 every_rank everything_on");
  EXPECT_EQ(of(*engine, engine_ops::generate.id), "11 spread_requests unchanged");
  EXPECT_EQ(of(*engine, engine_ops::submit.id), "11 stream_requests unchanged");
  EXPECT_EQ(of(*engine, engine_ops::cancel.id), "00 cancel_streams unchanged");
  EXPECT_EQ(of(*engine, engine_ops::sleep.id), "00 every_rank tagged_off weights/kv_cache");
  EXPECT_EQ(of(*engine, engine_ops::wake_up.id), "00 every_rank tagged_on weights/kv_cache");
  EXPECT_EQ(of(*engine, engine_ops::set_weights.id), "00 every_rank unchanged");
}
