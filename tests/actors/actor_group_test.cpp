// Actor groups on a real actor system: rank layout, pass-through and mesh dispatch, deadlines,
// failing and dying ranks, per-rank torch threads, and the group's Gloo collectives.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/actor_kind.hpp"
#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_interface.hpp"
#include "actors/tensor_convert.hpp"
#include "backends/error.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;

namespace {

struct counter_state final : kind_state {
  int64_t calls = 0;
};

/// The test kind's ops: each answers an untyped message, as a kind may.
namespace test_ops {
constexpr op_ref<caf::message(int64_t)> square{"square", caf::atom("square")};
constexpr op_ref<caf::message()> calls{"calls", caf::atom("calls")};
constexpr op_ref<caf::message(int32_t)> sleep{"sleep", caf::atom("sleep")};
constexpr op_ref<caf::message()> die_on_rank1{"die_on_rank1", caf::atom("die_r1")};
constexpr op_ref<caf::message()> throw_on_rank1{"throw_on_rank1", caf::atom("throw_r1")};
} // namespace test_ops

void register_test_kind() {
  actor_kind k;
  k.name = "test.worker";
  k.make_state = [](const rank_info&) { return std::make_unique<counter_state>(); };
  k.implements<rank_interface<test_ops::square, test_ops::calls, test_ops::sleep,
                              test_ops::die_on_rank1, test_ops::throw_on_rank1>>();
  k.add(typed_op(
      test_ops::square, +[](rank_context& ctx, counter_state& st, const int64_t& x) -> op_reply {
        st.calls++;
        return caf::make_message(x * x + ctx.info.rank * 1000);
      }));
  k.add(typed_op(
      test_ops::calls,
      +[](rank_context&, counter_state& st) -> op_reply { return caf::make_message(st.calls); }));
  k.add(context_op(
      test_ops::sleep, +[](rank_context&, const int32_t& ms) -> op_reply {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return caf::message{};
      }));
  k.add(context_op(
      test_ops::die_on_rank1, +[](rank_context& ctx) -> op_reply {
        if (ctx.info.rank == 1) {
          std::this_thread::sleep_for(100ms);
          ctx.exit_reason = caf::make_error(caf::exit_reason::kill);
        }
        return caf::message{};
      }));
  k.add(context_op(
      test_ops::throw_on_rank1, +[](rank_context& ctx) -> op_reply {
        if (ctx.info.rank == 1)
          backends::fail(backends::error_code::out_of_range, "token id 99999 outside vocab 512");
        return caf::message{};
      }));
  register_kind(std::move(k));
}

tensor_blob blob(const at::Tensor& t) {
  auto b = to_blob(t);
  EXPECT_TRUE(b);
  return b ? *b : tensor_blob{};
}

placement_group_info virtual_pg(int bundles, double gpu, double cpu) {
  placement_group_info pg;
  pg.name = "pg";
  pg.strategy = "pack";
  for (int i = 0; i < bundles; ++i)
    pg.bundles.push_back({static_cast<uint32_t>(i), "node0", {i}, {{"GPU", gpu}, {"CPU", cpu}}});
  return pg;
}

class ActorGroup : public ::testing::Test {
protected:
  void SetUp() override {
    register_test_kind();
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
  }
  void TearDown() override {
    for (auto& g : groups_)
      g.stop();
    sys_.reset();
  }

  actor_group spawn(group_spec spec) {
    auto g = actor_group::spawn(*sys_, spec);
    EXPECT_TRUE(g) << sys_->render(g.error());
    if (!g)
      return {};
    groups_.push_back(*g);
    return *g;
  }

  group_spec spec(std::string name, int bundles, int ranks = 0, bool collectives = false) {
    group_spec s;
    s.name = std::move(name);
    s.kind = "test.worker";
    s.placement = virtual_pg(bundles, 1.0, 2.0);
    s.num_ranks = ranks;
    s.collectives = collectives;
    s.init_timeout = 10s;
    return s;
  }

  template <class T>
  static T unwrap(const caf::message& m) {
    EXPECT_TRUE(m.size() >= 1 && m.match_element<T>(0)) << to_string(m);
    return m.get_as<T>(0);
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::vector<actor_group> groups_;
};

} // namespace

TEST_F(ActorGroup, RanksKnowRankWorldNodeAndDevice) {
  auto g = spawn(spec("layout", 3));
  auto ranks = g.ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*ranks)[r].rank, r);
    EXPECT_EQ((*ranks)[r].world_size, 3);
    EXPECT_EQ((*ranks)[r].node_id, "node0");
    EXPECT_EQ((*ranks)[r].device_ids, std::vector<int32_t>{r});
  }
  auto infos = g.call_all(rank_ops::info.id, caf::message{}, 5s);
  ASSERT_TRUE(infos) << sys_->render(infos.error());
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(unwrap<rank_info>((*infos)[r]).rank, r);
}

TEST_F(ActorGroup, SeveralRanksShareABundleWithFractionalGpus) {
  auto s = spec("colocated", 1, 5);
  s.gpu_per_rank = 0.2;
  auto plan = plan_ranks(s);
  ASSERT_TRUE(plan);
  for (auto& r : *plan) {
    EXPECT_EQ(r.device_ids, std::vector<int32_t>{0});
    EXPECT_DOUBLE_EQ(r.gpu_fraction, 0.2);
  }
  s.num_ranks = 6; // a sixth 0.2 share does not fit a 1-GPU bundle
  auto too_many = plan_ranks(s);
  ASSERT_FALSE(too_many);
  EXPECT_TRUE(is(too_many.error(), errc::invalid_argument));
  EXPECT_NE(error_message(too_many.error()).find("6 ranks x GPU 0.2"), std::string::npos)
    << error_message(too_many.error());
}

TEST_F(ActorGroup, PassThroughSendsTheSameCallToEveryRank) {
  auto g = spawn(spec("pass", 2));
  auto out = g.call_all(test_ops::square.id, caf::make_message(int64_t{7}), 5s);
  ASSERT_TRUE(out) << sys_->render(out.error());
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ(unwrap<int64_t>((*out)[0]), 49);
  EXPECT_EQ(unwrap<int64_t>((*out)[1]), 1049);
}

TEST_F(ActorGroup, MeshGivesChunkIToRankIAndKeepsRankOrder) {
  auto g = spawn(spec("mesh", 3));
  std::vector<caf::message> chunks;
  for (int64_t x : {2, 3, 4})
    chunks.push_back(caf::make_message(x));
  auto out = g.call_mesh(test_ops::square.id, chunks, 5s);
  ASSERT_TRUE(out) << sys_->render(out.error());
  EXPECT_EQ(unwrap<int64_t>((*out)[0]), 4);
  EXPECT_EQ(unwrap<int64_t>((*out)[1]), 1009);
  EXPECT_EQ(unwrap<int64_t>((*out)[2]), 2016);
}

TEST_F(ActorGroup, MeshRejectsAChunkCountThatIsNotTheWorldSize) {
  auto g = spawn(spec("mesh_bad", 2));
  auto out = g.call_mesh(test_ops::square.id, {caf::make_message(int64_t{1})}, 5s);
  ASSERT_FALSE(out);
  EXPECT_NE(error_message(out.error()).find("got 1 chunks for 2 ranks"), std::string::npos);
}

TEST_F(ActorGroup, EachRankSetsItsOwnTorchThreads) {
  auto s = spec("threads", 2);
  s.threads_per_rank = 2;
  auto g = spawn(s);
  auto out = g.call_all(rank_ops::threads.id, caf::message{}, 5s);
  ASSERT_TRUE(out);
  for (auto& m : *out)
    EXPECT_EQ(unwrap<int32_t>(m), 2);
  auto s1 = spec("threads1", 2);
  s1.threads_per_rank = 1;
  auto g1 = spawn(s1);
  out = g1.call_all(rank_ops::threads.id, caf::message{}, 5s);
  ASSERT_TRUE(out);
  for (auto& m : *out)
    EXPECT_EQ(unwrap<int32_t>(m), 1);
}

TEST_F(ActorGroup, AFailingRankNamesGroupRankAndOpAndStaysUsable) {
  auto g = spawn(spec("failing", 2));
  auto out = g.call_all(test_ops::throw_on_rank1.id, caf::message{}, 5s);
  ASSERT_FALSE(out);
  EXPECT_TRUE(is(out.error(), errc::out_of_range)) << sys_->render(out.error());
  auto msg = error_message(out.error());
  EXPECT_NE(msg.find("group 'failing' rank 1 op 'throw_on_rank1'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token id 99999"), std::string::npos) << msg;
  // The rank and its state survive.
  ASSERT_TRUE(g.call_all(test_ops::square.id, caf::make_message(int64_t{1}), 5s));
  auto calls = g.call_all(test_ops::calls.id, caf::message{}, 5s);
  ASSERT_TRUE(calls);
  EXPECT_EQ(unwrap<int64_t>((*calls)[1]), 1);
}

TEST_F(ActorGroup, BadArgumentsAndUnknownOpsAreErrorsNotCrashes) {
  auto g = spawn(spec("badargs", 1));
  auto out = g.call_all(test_ops::square.id, caf::make_message(std::string{"seven"}), 5s);
  ASSERT_FALSE(out);
  EXPECT_NE(error_message(out.error()).find("square expects (int64)"), std::string::npos);
  out = g.call_all(caf::atom("no_such_op"), caf::message{}, 5s);
  ASSERT_FALSE(out);
  EXPECT_TRUE(is(out.error(), errc::not_found));
  EXPECT_NE(error_message(out.error()).find("op 'no_such_op'"), std::string::npos);
  out = g.call_all(test_ops::square.id, caf::make_message(int64_t{3}), 0ms);
  ASSERT_FALSE(out);
  EXPECT_NE(error_message(out.error()).find("timeout must be > 0 ms, got 0"), std::string::npos);
  ASSERT_TRUE(g.call_all(test_ops::square.id, caf::make_message(int64_t{3}), 5s));
}

TEST_F(ActorGroup, ASlowRankTimesOutWithAnErrorNamingIt) {
  auto g = spawn(spec("slow", 2));
  auto out = g.call_all(test_ops::sleep.id, caf::make_message(int32_t{1500}), 200ms);
  ASSERT_FALSE(out);
  EXPECT_TRUE(is(out.error(), errc::timeout)) << sys_->render(out.error());
  EXPECT_NE(error_message(out.error()).find("no answer within 200 ms"), std::string::npos);
}

TEST_F(ActorGroup, ARankDyingMidCallFailsTheCallNamingTheRank) {
  auto g = spawn(spec("dying", 2));
  // Rank 1 accepts the call, then exits without answering (as a crashed worker would).
  auto out = g.call_all(test_ops::die_on_rank1.id, caf::message{}, 10s);
  ASSERT_FALSE(out);
  EXPECT_TRUE(is(out.error(), errc::rank_failed)) << sys_->render(out.error());
  EXPECT_NE(error_message(out.error()).find("group 'dying' rank 1 op 'die_on_rank1'"),
            std::string::npos)
    << error_message(out.error());
  // Later calls fail at once, naming the dead rank.
  out = g.call_all(test_ops::square.id, caf::make_message(int64_t{2}), 10s);
  ASSERT_FALSE(out);
  EXPECT_NE(error_message(out.error()).find("rank 1"), std::string::npos);
  EXPECT_NE(error_message(out.error()).find("dead"), std::string::npos);
}

TEST_F(ActorGroup, ARankKilledFromOutsideIsReportedDeadNamingTheRank) {
  auto g = spawn(spec("killed", 2));
  auto handles = g.rank_handles();
  ASSERT_TRUE(handles);
  caf::anon_send_exit((*handles)[0], caf::exit_reason::kill);
  std::this_thread::sleep_for(100ms);
  auto out = g.call_all(test_ops::square.id, caf::make_message(int64_t{2}), 10s);
  ASSERT_FALSE(out);
  EXPECT_TRUE(is(out.error(), errc::rank_failed));
  EXPECT_NE(error_message(out.error()).find("group 'killed' rank 0"), std::string::npos)
    << error_message(out.error());
}

TEST_F(ActorGroup, SpawnRejectsBadSpecsNamingTheValue) {
  auto s = spec("bad", 2, 3);
  auto g = actor_group::spawn(*sys_, s);
  ASSERT_FALSE(g);
  EXPECT_NE(error_message(g.error()).find("num_ranks 3 is not a multiple of the 2 bundles"),
            std::string::npos);
  s = spec("bad_kind", 1);
  s.kind = "no.such.kind";
  g = actor_group::spawn(*sys_, s);
  ASSERT_FALSE(g);
  EXPECT_NE(sys_->render(g.error()).find("unknown actor kind 'no.such.kind'"), std::string::npos);
  s = spec("neg", 1);
  s.gpu_per_rank = -0.5;
  EXPECT_FALSE(actor_group::spawn(*sys_, s));
  s = spec("", 1);
  EXPECT_FALSE(actor_group::spawn(*sys_, s));
  s = spec("nobundles", 1);
  s.placement.bundles.clear();
  EXPECT_FALSE(actor_group::spawn(*sys_, s));
}

TEST_F(ActorGroup, AllReduceSumsAndBroadcastCopiesAcrossRanks) {
  auto g = spawn(spec("gloo", 3, 0, true));
  std::vector<caf::message> chunks;
  for (int r = 0; r < 3; ++r) {
    auto t = at::full({4}, static_cast<float>(r + 1));
    auto i = at::arange(3, at::kLong) * (r + 1);
    chunks.push_back(caf::make_message(tensor_list{blob(t), blob(i)}));
  }
  auto out = g.call_mesh(rank_ops::all_reduce.id, chunks, 10s);
  ASSERT_TRUE(out) << sys_->render(out.error());
  for (auto& m : *out) {
    auto ts = unwrap<tensor_list>(m);
    ASSERT_EQ(ts.size(), 2u);
    auto f = from_blob(ts[0]);
    auto i = from_blob(ts[1]);
    ASSERT_TRUE(f && i);
    EXPECT_TRUE(at::equal(*f, at::full({4}, 6.0f)));
    EXPECT_TRUE(at::equal(*i, at::arange(3, at::kLong) * 6));
  }
  chunks.clear();
  for (int r = 0; r < 3; ++r)
    chunks.push_back(
      caf::make_message(tensor_list{blob(at::full({2, 2}, float(10 * r)))}, int32_t{2}));
  out = g.call_mesh(rank_ops::broadcast.id, chunks, 10s);
  ASSERT_TRUE(out) << sys_->render(out.error());
  for (auto& m : *out) {
    auto t = from_blob(unwrap<tensor_list>(m)[0]);
    ASSERT_TRUE(t);
    EXPECT_TRUE(at::equal(*t, at::full({2, 2}, 20.0f)));
  }
}

TEST_F(ActorGroup, CollectiveOpsWithoutAProcessGroupAreClearErrors) {
  auto g = spawn(spec("nogloo", 1));
  auto out =
      g.call_all(rank_ops::all_reduce.id, caf::make_message(tensor_list{blob(at::ones({2}))}), 5s);
  ASSERT_FALSE(out);
  EXPECT_NE(error_message(out.error()).find("before init_collective"), std::string::npos);
}

TEST_F(ActorGroup, GroupsSharingABundleReserveExactGpuSharesThroughTheManager) {
  node_resources n;
  n.node_id = "node0";
  n.gpus = 1;
  n.cpus = 2;
  auto mgr = spawn_placement_manager(*sys_, {n}, 10s);
  placement_client pgs{*sys_, mgr};
  auto pg = pgs.create({"colocated", {{{"GPU", 1}, {"CPU", 2}}}, "strict_pack", 0});
  ASSERT_TRUE(pg) << sys_->render(pg.error());
  auto make = [&](std::string name, int ranks) {
    group_spec s;
    s.name = std::move(name);
    s.kind = "test.worker";
    s.placement = *pg;
    s.num_ranks = ranks;
    s.gpu_per_rank = 0.2;
    s.collectives = false;
    s.placement_manager = mgr;
    return s;
  };
  auto policy = actor_group::spawn(*sys_, make("policy", 4)); // 0.8 of the GPU
  ASSERT_TRUE(policy) << sys_->render(policy.error());
  auto ref = actor_group::spawn(*sys_, make("ref", 2)); // 0.4 more: does not fit
  ASSERT_FALSE(ref);
  EXPECT_NE(error_message(ref.error()).find("group 'ref': rank 1 cannot take GPU 0.2"),
            std::string::npos)
    << error_message(ref.error());
  auto engine = actor_group::spawn(*sys_, make("engine", 1)); // the last 0.2 fits exactly
  ASSERT_TRUE(engine) << sys_->render(engine.error());
  policy->stop();
  // The stopped group's shares come back (the release is asynchronous: retry briefly).
  caf::expected<actor_group> ref2{caf::error{}};
  for (int i = 0; i < 50 && !ref2; ++i) {
    ref2 = actor_group::spawn(*sys_, make("ref", 2));
    if (!ref2)
      std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(ref2) << sys_->render(ref2.error());
  ref2->stop();
  engine->stop();
  caf::anon_send_exit(mgr, caf::exit_reason::user_shutdown);
}
