// The rendezvous store actor: c10d's store operations answered exactly, waits that end when their
// keys arrive or time out naming the missing ones, bad input refused with the state intact,
// several Gloo groups meeting through one store at once (their sums equal the same reduction
// over an in-process store), and a store that stops with its owner, failing its clients clearly.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/rendezvous_store.hpp"
#include "backends/error.hpp"
#include "runtime/errc.hpp"
#include "test_support.hpp"

namespace rlforge::actors::test {
namespace {

using namespace std::chrono_literals;
using bytes = std::vector<uint8_t>;
namespace be = rlforge::backends;

bytes b(const std::string& s) {
  return bytes(s.begin(), s.end());
}

class RendezvousStore : public rendezvous_fixture {
protected:
  /// One request to the store: its answer, or the error's rlforge code and message.
  template <class T, class... Ts> caf::expected<T> ask(Ts... xs) {
    caf::scoped_actor self{*sys_};
    caf::expected<T> out{caf::error{}};
    self->request(store_, 10s, xs...)
      .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  template <class T> T ok(caf::expected<T> x) {
    EXPECT_TRUE(x) << sys_->render(x.error());
    return x ? *x : T{};
  }
};

TEST_F(RendezvousStore, AnswersC10dsStoreOperationsExactly) {
  caf::scoped_actor self{*sys_};
  self->request(store_, 10s, kv_set_atom::value, std::string{"k"}, b("v1"))
    .receive([] {}, [&](caf::error& e) { FAIL() << sys_->render(e); });
  EXPECT_EQ(ok(ask<bytes>(kv_get_atom::value, std::string{"k"}, int64_t{1000})), b("v1"));
  EXPECT_EQ(ok(ask<int64_t>(kv_add_atom::value, std::string{"n"}, int64_t{5})), 5);
  EXPECT_EQ(ok(ask<int64_t>(kv_add_atom::value, std::string{"n"}, int64_t{-7})), -2);
  EXPECT_EQ(ok(ask<bytes>(kv_get_atom::value, std::string{"n"}, int64_t{1000})), b("-2"));
  // compare-set: a mismatch answers the value held; a match (or absent + empty) stores desired.
  EXPECT_EQ(ok(ask<bytes>(kv_swap_atom::value, std::string{"k"}, b("no"), b("v2"))), b("v1"));
  EXPECT_EQ(ok(ask<bytes>(kv_swap_atom::value, std::string{"k"}, b("v1"), b("v2"))), b("v2"));
  EXPECT_EQ(ok(ask<bytes>(kv_swap_atom::value, std::string{"new"}, bytes{}, b("x"))), b("x"));
  EXPECT_EQ(ok(ask<bytes>(kv_swap_atom::value, std::string{"none"}, b("e"), b("x"))), b("e"));
  EXPECT_TRUE(ok(ask<bool>(kv_check_atom::value, std::vector<std::string>{"k", "n", "new"})));
  EXPECT_FALSE(ok(ask<bool>(kv_check_atom::value, std::vector<std::string>{"k", "none"})));
  EXPECT_EQ(ok(ask<int64_t>(kv_count_atom::value)), 3);
  EXPECT_TRUE(ok(ask<bool>(kv_erase_atom::value, std::string{"k"})));
  EXPECT_FALSE(ok(ask<bool>(kv_erase_atom::value, std::string{"k"})));
  EXPECT_EQ(ok(ask<int64_t>(kv_count_atom::value)), 2);
}

TEST_F(RendezvousStore, AWaitEndsWhenItsKeysArriveOrTimesOutNamingTheMissingOnes) {
  caf::scoped_actor getter{*sys_};
  auto pending_get = getter->request(store_, 10s, kv_get_atom::value, std::string{"late"},
                                     int64_t{10000});
  caf::scoped_actor waiter{*sys_};
  auto pending_wait = waiter->request(store_, 10s, kv_wait_atom::value,
                                      std::vector<std::string>{"late", "later"}, int64_t{10000});
  caf::anon_send(store_, kv_set_atom::value, std::string{"late"}, b("1"));
  bytes got;
  pending_get.receive([&](bytes& x) { got = x; }, [&](caf::error& e) { FAIL() << sys_->render(e); });
  EXPECT_EQ(got, b("1"));
  ok(ask<int64_t>(kv_add_atom::value, std::string{"later"}, int64_t{1}));
  bool all = false;
  pending_wait.receive([&](bool x) { all = x; }, [&](caf::error& e) { FAIL() << sys_->render(e); });
  EXPECT_TRUE(all);

  auto timed_out = ask<bool>(kv_wait_atom::value, std::vector<std::string>{"late", "zz"},
                             int64_t{100});
  ASSERT_FALSE(timed_out);
  EXPECT_TRUE(is(timed_out.error(), errc::timeout)) << sys_->render(timed_out.error());
  auto why = error_message(timed_out.error());
  EXPECT_NE(why.find("'zz'"), std::string::npos) << why;
  EXPECT_EQ(why.find("'late'"), std::string::npos) << why;
  auto get_timeout = ask<bytes>(kv_get_atom::value, std::string{"never"}, int64_t{50});
  ASSERT_FALSE(get_timeout);
  EXPECT_NE(error_message(get_timeout.error()).find("'never'"), std::string::npos);
  EXPECT_EQ(ok(ask<int64_t>(kv_count_atom::value)), 2);
}

TEST_F(RendezvousStore, BadInputIsRefusedAndTheStoreKeepsItsState) {
  ok(ask<int64_t>(kv_add_atom::value, std::string{"n"}, int64_t{3}));
  caf::anon_send(store_, kv_set_atom::value, std::string{"text"}, b("abc"));
  auto not_int = ask<int64_t>(kv_add_atom::value, std::string{"text"}, int64_t{1});
  ASSERT_FALSE(not_int);
  EXPECT_TRUE(is(not_int.error(), errc::invalid_argument));
  EXPECT_NE(error_message(not_int.error()).find("'text'"), std::string::npos);
  for (int64_t bad : {int64_t{0}, int64_t{-5}}) {
    auto w = ask<bool>(kv_wait_atom::value, std::vector<std::string>{"n"}, bad);
    ASSERT_FALSE(w);
    EXPECT_TRUE(is(w.error(), errc::invalid_argument));
    EXPECT_NE(error_message(w.error()).find("got " + std::to_string(bad)), std::string::npos);
    auto g = ask<bytes>(kv_get_atom::value, std::string{"n"}, bad);
    ASSERT_FALSE(g);
    EXPECT_TRUE(is(g.error(), errc::invalid_argument));
  }
  EXPECT_EQ(ok(ask<bytes>(kv_get_atom::value, std::string{"text"}, int64_t{1000})), b("abc"));
  EXPECT_EQ(ok(ask<bytes>(kv_get_atom::value, std::string{"n"}, int64_t{1000})), b("3"));

  EXPECT_THROW(connect_rendezvous_store(rendezvous_store_actor{}, 1000ms), be::error);
  try {
    connect_rendezvous_store(store_, 0ms);
    ADD_FAILURE() << "a zero timeout was accepted";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument);
  }
}

/// Every rank of `groups` groups of `ranks` ranks (threads) joins its Gloo group through
/// `store` at once and all-reduces (rank + 1) * (group + 1) * [1, 2, 3]: the sums per group.
std::vector<std::vector<double>> reduce_in_groups(const std::vector<be::store_handle>& stores,
                                                  int ranks) {
  const int groups = static_cast<int>(stores.size());
  std::vector<std::vector<double>> sums(static_cast<size_t>(groups));
  std::vector<std::string> errors(static_cast<size_t>(groups * ranks));
  std::vector<std::thread> threads;
  for (int g = 0; g < groups; ++g)
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, g, r] {
        try {
          be::collective_options o;
          o.timeout = 20s;
          o.group_name = "group-" + std::to_string(g);
          auto group = be::collective_group::create(stores[static_cast<size_t>(g)], r, ranks, o);
          auto t = at::arange(1, 4, at::kDouble) * ((r + 1) * (g + 1));
          group->all_reduce_sum(t);
          if (r == 0)
            sums[static_cast<size_t>(g)] = {t[0].item<double>(), t[1].item<double>(),
                                            t[2].item<double>()};
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(g * ranks + r)] = e.what();
        }
      });
  for (auto& t : threads)
    t.join();
  for (size_t i = 0; i < errors.size(); ++i)
    EXPECT_EQ(errors[i], "") << "rank " << i;
  return sums;
}

TEST_F(RendezvousStore, SeveralGroupsMeetThroughOneStoreAtOnceAndReduceAsAlone) {
  auto through_actor = connect_rendezvous_store(store_, 20s);
  EXPECT_EQ(through_actor.kind(), be::store_kind::external);
  EXPECT_NE(through_actor.description().find("rendezvous store actor"), std::string::npos);
  auto together = reduce_in_groups({through_actor, through_actor, through_actor}, 3);
  for (int g = 0; g < 3; ++g) {
    auto alone = reduce_in_groups({be::make_in_process_store()}, 3);
    // Group g's values are (g + 1) times group 0's: sum over r of (r + 1) = 6.
    auto factor = 6.0 * (g + 1);
    EXPECT_EQ(together[static_cast<size_t>(g)],
              (std::vector<double>{alone[0][0] * (g + 1), alone[0][1] * (g + 1),
                                   alone[0][2] * (g + 1)}));
    EXPECT_EQ(together[static_cast<size_t>(g)],
              (std::vector<double>{factor, 2 * factor, 3 * factor}));
  }
}

TEST_F(RendezvousStore, StopsWithItsOwnerAndItsClientsFailNamingIt) {
  caf::scoped_actor self{*sys_};
  self->monitor(store_);
  caf::anon_send_exit(owner_, caf::exit_reason::user_shutdown);
  bool down = false;
  self->receive([&](caf::down_msg& m) { down = m.source == store_.address(); },
                caf::after(10s) >> [] {});
  ASSERT_TRUE(down) << "the store outlived its owner";
  auto gone = connect_rendezvous_store(store_, 2000ms);
  auto start = std::chrono::steady_clock::now();
  try {
    be::collective_options o;
    o.timeout = 2000ms;
    be::collective_group::create(gone, 0, 2, o);
    ADD_FAILURE() << "a rendezvous through a stopped store succeeded";
  } catch (const be::error& e) {
    EXPECT_NE(std::string{e.what()}.find("rendezvous store actor"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

} // namespace
} // namespace rlforge::actors::test
