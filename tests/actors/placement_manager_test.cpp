// The placement-group manager actor: placed, infeasible, pending → placed, pending → timeout,
// node joins, fractional reservations, and bad input that leaves the manager usable.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <limits>

#include <caf/all.hpp>

#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;

namespace {

node_resources node(std::string id, int gpus, int cpus) {
  node_resources n;
  n.node_id = std::move(id);
  n.gpus = gpus;
  n.cpus = cpus;
  n.memory_bytes = int64_t{16} << 30;
  return n;
}

placement_group_request request(std::string name, std::vector<resource_amounts> bundles,
                                std::string strategy = "pack", double timeout_s = 0) {
  return {std::move(name), std::move(bundles), std::move(strategy), timeout_s};
}

class PlacementManager : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    auto mgr = spawn_placement_manager(*sys_, {node("n0", 4, 8), node("n1", 4, 8)}, 180s);
    client_ = std::make_unique<placement_client>(*sys_, mgr);
  }
  void TearDown() override {
    caf::anon_send_exit(client_->handle(), caf::exit_reason::user_shutdown);
    client_.reset();
    sys_.reset();
  }

  void expect_error(const caf::expected<placement_group_info>& r, errc code,
                    const std::string& text) {
    ASSERT_FALSE(r) << "expected an error containing '" << text << "'";
    EXPECT_TRUE(is(r.error(), code)) << sys_->render(r.error());
    EXPECT_NE(error_message(r.error()).find(text), std::string::npos)
      << error_message(r.error());
  }

  /// The manager is still alive and its state intact: a fresh group can be placed and removed.
  void expect_still_usable() {
    auto r = client_->create(request("probe", {{{"GPU", 1}}}));
    ASSERT_TRUE(r) << sys_->render(r.error());
    ASSERT_TRUE(client_->remove("probe"));
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<placement_client> client_;
};

} // namespace

TEST_F(PlacementManager, PlacesAndOrdersBundlesByNodeAndDevice) {
  auto r = client_->create(request("a", {{{"GPU", 1}}, {{"GPU", 1}}, {{"GPU", 1}}}, "spread"));
  ASSERT_TRUE(r) << sys_->render(r.error());
  ASSERT_EQ(r->bundles.size(), 3u);
  for (size_t i = 1; i < r->bundles.size(); ++i) {
    auto& p = r->bundles[i - 1];
    auto& q = r->bundles[i];
    EXPECT_TRUE(p.node_id < q.node_id || (p.node_id == q.node_id && p.device_ids < q.device_ids));
  }
  auto got = client_->get("a");
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, *r);
  auto table = client_->table();
  ASSERT_TRUE(table);
  EXPECT_NE(table->find("a"), std::string::npos) << *table;
}

TEST_F(PlacementManager, InfeasibleFailsAtOnceNamingTheBundle) {
  auto r = client_->create(request("big", {{{"GPU", 1}}, {{"GPU", 8}}}));
  expect_error(r, errc::infeasible, "bundle 1");
  r = client_->create(request("many", {{{"GPU", 1}}, {{"GPU", 1}}, {{"GPU", 1}}},
                              "strict_spread"));
  expect_error(r, errc::infeasible, "strict_spread");
  expect_still_usable();
}

TEST_F(PlacementManager, PendingGroupIsPlacedWhenResourcesFreeUp) {
  ASSERT_TRUE(client_->create(request("holder", {{{"GPU", 4}}, {{"GPU", 4}}}, "spread")));
  auto waiting = std::async(std::launch::async, [&] {
    return client_->create(request("waiter", {{{"GPU", 2}}}, "pack", 20));
  });
  EXPECT_EQ(waiting.wait_for(300ms), std::future_status::timeout);
  ASSERT_TRUE(client_->remove("holder"));
  auto r = waiting.get();
  ASSERT_TRUE(r) << sys_->render(r.error());
  EXPECT_EQ(r->bundles.size(), 1u);
  EXPECT_EQ(r->bundles[0].device_ids.size(), 2u);
}

TEST_F(PlacementManager, PendingGroupIsPlacedWhenANodeJoins) {
  ASSERT_TRUE(client_->create(request("holder", {{{"GPU", 4}}, {{"GPU", 4}}}, "spread")));
  auto waiting = std::async(std::launch::async, [&] {
    return client_->create(request("waiter", {{{"GPU", 1}}}, "pack", 20));
  });
  EXPECT_EQ(waiting.wait_for(200ms), std::future_status::timeout);
  ASSERT_TRUE(client_->add_node(node("n2", 2, 4)));
  auto r = waiting.get();
  ASSERT_TRUE(r) << sys_->render(r.error());
  EXPECT_EQ(r->bundles[0].node_id, "n2");
}

TEST_F(PlacementManager, PendingGroupTimesOutSayingWhatIsHeldAndByWhom) {
  ASSERT_TRUE(client_->create(request("holder", {{{"GPU", 4}}, {{"GPU", 4}}}, "spread")));
  auto start = std::chrono::steady_clock::now();
  auto r = client_->create(request("late", {{{"GPU", 1}}}, "pack", 0.3));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  expect_error(r, errc::timeout, "still pending after 300 ms");
  EXPECT_NE(error_message(r.error()).find("holder"), std::string::npos)
    << error_message(r.error());
  // The timed-out group left no trace: freeing the holder places nothing stale.
  ASSERT_TRUE(client_->remove("holder"));
  EXPECT_FALSE(client_->get("late"));
  expect_still_usable();
}

TEST_F(PlacementManager, FractionalReservationsAreExact) {
  ASSERT_TRUE(client_->create(request("colo", {{{"GPU", 1}, {"CPU", 2}}})));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = client_->reserve("colo", 0, {{"GPU", 0.2}});
    ASSERT_TRUE(id) << "reservation " << i << ": " << sys_->render(id.error());
    ids.push_back(*id);
  }
  auto sixth = client_->reserve("colo", 0, {{"GPU", 0.2}});
  ASSERT_FALSE(sixth);
  ASSERT_TRUE(client_->release("colo", ids.back()));
  EXPECT_TRUE(client_->reserve("colo", 0, {{"GPU", 0.2}}));
  auto out_of_range = client_->reserve("colo", 3, {{"GPU", 0.2}});
  ASSERT_FALSE(out_of_range);
  EXPECT_NE(error_message(out_of_range.error()).find("3"), std::string::npos);
}

TEST_F(PlacementManager, BadRequestsAreClearErrorsAndChangeNothing) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error(client_->create(request("z", {{{"GPU", 0}}})), errc::invalid_argument, "bundle 0");
  expect_error(client_->create(request("neg", {{{"GPU", -1}}})), errc::invalid_argument, "-1");
  expect_error(client_->create(request("nan", {{{"CPU", nan}}})), errc::invalid_argument, "nan");
  expect_error(client_->create(request("empty", {{}})), errc::invalid_argument, "bundle 0");
  expect_error(client_->create(request("none", {})), errc::invalid_argument, "none");
  expect_error(client_->create(request("strat", {{{"GPU", 1}}}, "packed")),
               errc::invalid_argument, "packed");
  expect_error(client_->create(request("", {{{"GPU", 1}}})), errc::invalid_argument,
               "name must not be empty");
  expect_error(client_->create(request("t", {{{"GPU", 1}}}, "pack", -1)),
               errc::invalid_argument, "timeout");
  ASSERT_TRUE(client_->create(request("dup", {{{"GPU", 1}}})));
  expect_error(client_->create(request("dup", {{{"GPU", 1}}})), errc::already_exists, "dup");
  auto rm = client_->remove("ghost");
  ASSERT_FALSE(rm);
  EXPECT_TRUE(is(rm.error(), errc::not_found));
  EXPECT_NE(error_message(rm.error()).find("ghost"), std::string::npos);
  auto bad_node = client_->add_node(node("n0", 1, 1));
  ASSERT_FALSE(bad_node);
  EXPECT_TRUE(is(bad_node.error(), errc::already_exists));
  expect_still_usable();
  ASSERT_TRUE(client_->get("dup"));
}

TEST_F(PlacementManager, ANodeThatDiesFailsItsGroupsAndFreesTheirOtherBundles) {
  auto spread = client_->create(request("spread", {{{"GPU", 4}}, {{"GPU", 4}}}, "strict_spread"));
  ASSERT_TRUE(spread) << sys_->render(spread.error());
  caf::scoped_actor self{*sys_};
  std::vector<std::string> failed;
  self->request(client_->handle(), 10s, remove_node_atom::value, std::string{"n1"},
                std::string{"died (test)"})
    .receive([&](std::vector<std::string>& x) { failed = x; },
             [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
  EXPECT_EQ(failed, std::vector<std::string>{"spread"});
  auto gone = client_->get("spread");
  ASSERT_FALSE(gone);
  EXPECT_TRUE(is(gone.error(), errc::rank_failed));
  EXPECT_NE(error_message(gone.error()).find("node 'n1' died (test)"), std::string::npos)
    << error_message(gone.error());
  auto reserve = client_->reserve("spread", 0, {{"GPU", 0.5}});
  ASSERT_FALSE(reserve);
  EXPECT_TRUE(is(reserve.error(), errc::rank_failed));
  // n0's GPUs are free again; n1's left the cluster.
  auto all_of_n0 = client_->create(request("n0-full", {{{"GPU", 4}}}, "pack", 2));
  ASSERT_TRUE(all_of_n0) << sys_->render(all_of_n0.error());
  EXPECT_EQ(all_of_n0->bundles[0].node_id, "n0");
  auto infeasible = client_->create(request("too-big", {{{"GPU", 1}}, {{"GPU", 1}}},
                                            "strict_spread", 2));
  ASSERT_FALSE(infeasible);
  // The failed group is forgotten on remove and its name can be used again.
  EXPECT_TRUE(client_->remove("spread"));
  ASSERT_TRUE(client_->remove("n0-full"));
  EXPECT_TRUE(client_->create(request("spread", {{{"GPU", 1}}})));
  // An unknown node is an error; the manager stays usable.
  caf::error unknown;
  self->request(client_->handle(), 10s, remove_node_atom::value, std::string{"n9"},
                std::string{"x"})
    .receive([](std::vector<std::string>&) {}, [&](caf::error& e) { unknown = e; });
  EXPECT_TRUE(is(unknown, errc::not_found)) << sys_->render(unknown);
  // The status lists the remaining node and the groups.
  std::string status;
  self->request(client_->handle(), 10s, pg_status_atom::value)
    .receive([&](std::string& s) { status = s; }, [](caf::error&) {});
  EXPECT_NE(status.find("\"id\":\"n0\""), std::string::npos) << status;
  EXPECT_EQ(status.find("\"id\":\"n1\""), std::string::npos) << status;
}

// place_again: the old group is replaced; a candidate `accept` turns down is placed again until
// one is kept; with no candidate kept in time, the error is the last attempt's failure and no
// group of that name is left holding resources.
TEST_F(PlacementManager, PlaceAgainRetriesUntilACandidateIsKeptOrTimeRunsOut) {
  ASSERT_TRUE(client_->create(request("engines", {{{"GPU", 4}}})));
  int tries = 0;
  auto kept = client_->place_again(request("engines", {{{"GPU", 4}}}), 10s,
                                   [&](const placement_group_info& pg) -> std::string {
                                     return ++tries < 3 ? "try " + std::to_string(tries) : "";
                                   });
  ASSERT_TRUE(kept) << sys_->render(kept.error());
  EXPECT_EQ(tries, 3);
  EXPECT_EQ(kept->name, "engines");
  auto held = client_->get("engines");
  ASSERT_TRUE(held);
  EXPECT_EQ(*held, *kept);

  auto refused = client_->place_again(request("engines", {{{"GPU", 4}}}), 700ms,
                                      [](const placement_group_info& pg) {
                                        return "node '" + pg.bundles.at(0).node_id + "' is lost";
                                      });
  expect_error(refused, errc::timeout, "is lost");
  EXPECT_FALSE(client_->get("engines"));
  // No room at all: the last failure says so.
  auto no_room = client_->place_again(request("huge", {{{"GPU", 3}}, {{"GPU", 3}}, {{"GPU", 3}}}),
                                      500ms, [](const placement_group_info&) { return ""; });
  ASSERT_FALSE(no_room);
  EXPECT_NE(error_message(no_room.error()).find("no room"), std::string::npos)
      << error_message(no_room.error());
  expect_still_usable();
}
