// The bounded-staleness buffer and the JSON form of a producer's snapshot: staleness from the
// per-token versions, stale rollouts dropped and counted, batches ordered by id, the histogram,
// and refusals of bad arguments and malformed snapshots.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "rl/rollout_buffer.hpp"
#include "rl/rollout_json.hpp"

namespace rlforge::rl {
namespace {

/// Rollout `id` with one row whose tokens were made by `versions`.
rollout made_by(int64_t id, std::vector<int64_t> versions) {
  rollout r;
  r.id = id;
  r.request.prompt = {1, 2};
  r.request.num_samples = 1;
  sample_output s;
  for (size_t i = 0; i < versions.size(); ++i) {
    s.tokens.push_back(static_cast<int64_t>(5 + i));
    s.logprobs.push_back(-0.5 * static_cast<double>(i + 1));
  }
  s.token_versions = std::move(versions);
  s.stop_reason = "length";
  r.samples.push_back(std::move(s));
  r.submissions = 1;
  return r;
}

TEST(RolloutStaleness, IsTheDistanceToTheOldestToken) {
  EXPECT_EQ(oldest_version(made_by(0, {3, 3, 4})), 3);
  EXPECT_EQ(staleness_of(made_by(0, {3, 3, 4}), 5), 2);
  EXPECT_EQ(staleness_of(made_by(0, {5, 5}), 5), 0);
  EXPECT_EQ(staleness_of(made_by(0, {6}), 5), 0); // newer than the trainer counts as fresh
  EXPECT_EQ(oldest_version(made_by(0, {})), -1);
  EXPECT_EQ(staleness_of(made_by(0, {}), 9), 0);
  auto two_rows = made_by(0, {4, 4});
  two_rows.samples.push_back(made_by(0, {2, 4}).samples[0]);
  EXPECT_EQ(staleness_of(two_rows, 4), 2);
}

TEST(RolloutBuffer, TakesTheFirstFinishedInIdOrderAndDropsStaleOnes) {
  rollout_buffer b;
  b.add(made_by(7, {1, 2}));
  b.add(made_by(3, {2, 2}));
  b.add(made_by(5, {0, 2})); // staleness 2 at version 2
  b.add(made_by(9, {2}));
  EXPECT_FALSE(b.take(4, 2, 1)); // 5 is dropped; three are left
  EXPECT_EQ(b.size(), 3u);
  b.count_requeue();
  auto batch = b.take(2, 2, 1);
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->rollouts.size(), 2u);
  EXPECT_EQ(batch->rollouts[0].id, 3); // 7 and 3 finished first; ordered by id
  EXPECT_EQ(batch->rollouts[1].id, 7);
  EXPECT_EQ(batch->staleness, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(batch->dropped_ids, (std::vector<int64_t>{5}));
  EXPECT_EQ(batch->requeued, 1);
  auto next = b.take(1, 3, 1);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rollouts[0].id, 9);
  EXPECT_TRUE(next->dropped_ids.empty());
  EXPECT_EQ(next->requeued, 0);
  auto st = b.state();
  EXPECT_EQ(st.taken, 3);
  EXPECT_EQ(st.dropped, 1);
  EXPECT_EQ(st.requeued, 1);
  EXPECT_EQ(st.staleness_counts, (std::vector<int64_t>{1, 2}));
}

TEST(RolloutBuffer, RefusesBadArgumentsAndRestoresItsState) {
  rollout_buffer b;
  EXPECT_THROW(b.take(0, 1, 1), std::invalid_argument);
  EXPECT_THROW(b.take(1, 1, -1), std::invalid_argument);
  b.add(made_by(1, {1}));
  auto st = b.state();
  rollout_buffer c;
  c.restore(st);
  EXPECT_EQ(c.state(), st);
  ASSERT_TRUE(c.take(1, 1, 0));
}

TEST(RolloutJson, RoundTripsAndNamesWhatIsWrong) {
  rollout_state s;
  s.waiting.push_back(made_by(4, {}));
  s.waiting[0].samples.clear();
  s.waiting[0].request.stop_strings = {"\n", "Ende ¶"};
  s.waiting[0].request.seed = 18446744073709551615ULL;
  s.waiting[0].request.has_seed = true;
  s.done.push_back(made_by(2, {3, 4, 4}));
  s.taken = 5;
  s.dropped = 1;
  s.requeued = 2;
  s.staleness_counts = {3, 2};
  EXPECT_EQ(rollout_state_from_json(to_json(s)), s);
  EXPECT_EQ(rollout_state_from_json(nlohmann::json::parse(to_json(s).dump())), s);

  auto expect_bad = [](nlohmann::json j, const std::string& part) {
    try {
      rollout_state_from_json(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string{e.what()}.find(part), std::string::npos) << e.what();
    }
  };
  expect_bad(nlohmann::json::array(), "expected a JSON object");
  auto j = to_json(s);
  j.erase("done");
  expect_bad(j, "state.done is missing");
  j = to_json(s);
  j["done"][0]["samples"][0]["tokens"] = "many";
  expect_bad(j, "state.done[0].samples[0].tokens has the wrong type");
  j = to_json(s);
  j["waiting"][0]["request"].erase("seed");
  expect_bad(j, "state.waiting[0].request.seed is missing");
  j = to_json(s);
  j["staleness_counts"] = {1, -1};
  expect_bad(j, "negative count");
  j = to_json(s);
  j["dropped"] = -3;
  expect_bad(j, "negative count");
}

} // namespace
} // namespace rlforge::rl
