// The --env job's episode producer with a runner standing in for engines and environments:
// groups are taken in the order they finish (a slow one holds no take back), staler groups are
// dropped and counted, every group asked for is taken, dropped or still held, a runner's
// failure and a timeout are clear errors, and bad arguments are refused.
#include "examples/grpo/episode_producer.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rlforge::examples::grpo {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

/// One sampled token per episode at `version`, preceded by an observation token (no version).
episode_sample episode(int64_t version) {
  episode_sample e;
  e.prompt = {1};
  e.response = {5, 6};
  e.sampled = {0.0f, 1.0f};
  e.logprobs = {0.0, -0.5};
  e.versions = {-1, version};
  return e;
}

/// A gate the slow groups wait at until the test opens it.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [this] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

episode_group group(int64_t id) {
  episode_group g;
  g.id = id;
  g.request.seed = id;
  return g;
}

TEST(EpisodeProducer, TakesGroupsInTheOrderTheyFinishSoASlowOneHoldsNoTakeBack) {
  gate slow;
  std::atomic<int64_t> version{3};
  episode_producer p(
      [&](const episode_group& g) {
        if (g.id == 0)
          slow.wait();
        return std::vector<episode_sample>(2, episode(version.load()));
      },
      4);
  for (int64_t id = 0; id < 4; ++id)
    p.add(group(id));
  auto first = p.take(2, 3, 0, 60s);
  ASSERT_EQ(first.groups.size(), 2u);
  for (const auto& g : first.groups) {
    EXPECT_NE(g.id, 0) << "the take waited for the slow group";
    EXPECT_EQ(g.episodes.size(), 2u);
  }
  EXPECT_LT(first.groups[0].id, first.groups[1].id);
  EXPECT_EQ(first.staleness, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(p.held(), 2u);
  slow.release();
  auto second = p.take(2, 3, 0, 60s);
  std::set<int64_t> ids;
  for (const auto& g : first.groups)
    ids.insert(g.id);
  for (const auto& g : second.groups)
    ids.insert(g.id);
  EXPECT_EQ(ids, (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.held(), 0u);
  EXPECT_EQ(p.accounting().taken, 4);
}

TEST(EpisodeProducer, DropsGroupsStalerThanTheBoundAndLosesNone) {
  std::atomic<int64_t> version{1};
  std::atomic<int> ran{0};
  episode_producer p(
      [&](const episode_group&) {
        auto out = std::vector<episode_sample>{episode(version.load())};
        ++ran;
        return out;
      },
      2);
  for (int64_t id = 0; id < 3; ++id)
    p.add(group(id));
  // Version 1 groups against a trainer at version 2: staleness 1, within a bound of 1.
  auto a = p.take(3, 2, 1, 60s);
  EXPECT_EQ(a.staleness, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(a.dropped, 0);
  // Three more sampled on version 1, then the trainer moves to version 4 (bound 1): they are
  // dropped at the next take, which waits for a fresh group instead.
  for (int64_t id = 3; id < 6; ++id)
    p.add(group(id));
  while (ran.load() < 6)
    std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(50ms); // the last one is stored after its runner returns
  version = 4;
  p.add(group(6));
  auto b = p.take(1, 4, 1, 60s);
  ASSERT_EQ(b.groups.size(), 1u);
  EXPECT_EQ(b.groups[0].id, 6);
  EXPECT_EQ(b.staleness, (std::vector<int64_t>{0}));
  EXPECT_EQ(b.dropped, 3);
  // Every group asked for was taken or dropped; none is held, none counted twice.
  auto acc = p.accounting();
  EXPECT_EQ(acc.taken, 4);
  EXPECT_EQ(acc.dropped, 3);
  EXPECT_EQ(p.held(), 0u);
  EXPECT_EQ(acc.staleness_counts, (std::vector<int64_t>{1, 3}));
  EXPECT_THROW(p.take(1, 4, 1, 1s), std::runtime_error); // nothing held to wait for
}

TEST(EpisodeProducer, ARunnersFailureAndATimeoutAreClearErrors) {
  gate never;
  {
    episode_producer p(
        [&](const episode_group& g) -> std::vector<episode_sample> {
          if (g.id == 1)
            throw std::runtime_error("4 turns failed 4 times; the last error: no engine");
          never.wait();
          return {episode(0)};
        },
        2);
    p.add(group(0));
    try {
      p.take(1, 0, 0, 100ms);
      ADD_FAILURE() << "a take without a finished group returned";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("no 1 finished groups after 100 ms (1 running, 0 queued, "
                                      "0 finished)"));
    }
    p.add(group(1));
    for (int i = 0; i < 2; ++i) { // every later take reports it too
      try {
        p.take(1, 0, 0, 60s);
        ADD_FAILURE() << "a take after a failed runner returned";
      } catch (const std::runtime_error& e) {
        EXPECT_THAT(e.what(), HasSubstr("group 1: 4 turns failed 4 times; the last error: no "
                                        "engine"));
      }
    }
    never.release(); // the destructor waits for group 0
  }
}

TEST(EpisodeProducer, RefusesBadArguments) {
  auto run = [](const episode_group&) { return std::vector<episode_sample>{episode(0)}; };
  EXPECT_THROW(episode_producer(run, 0), std::invalid_argument);
  EXPECT_THROW(episode_producer(group_runner{}, 1), std::invalid_argument);
  episode_producer p(run, 1);
  p.add(group(7));
  try {
    p.add(group(7));
    ADD_FAILURE() << "accepted a group id twice";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("group 7 is held already"));
  }
  EXPECT_THROW(p.take(0, 0, 0, 1s), std::invalid_argument);
  try {
    p.take(1, 0, -1, 1s);
    ADD_FAILURE() << "accepted a negative bound";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("the staleness bound must be >= 0, got -1"));
  }
  try {
    p.take(2, 0, 0, 1s);
    ADD_FAILURE() << "waited for more groups than held";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 groups asked for, 1 held"));
  }
  EXPECT_EQ(p.take(1, 0, 0, 60s).groups.at(0).id, 7); // still usable
}

TEST(EpisodeGroup, StalenessIsThatOfTheOldestSampledToken) {
  auto g = group(0);
  EXPECT_EQ(g.oldest_version(), -1);
  EXPECT_EQ(staleness_of(g, 5), 0); // nothing sampled: never stale
  g.episodes = {episode(4), episode(2)};
  EXPECT_EQ(g.oldest_version(), 2);
  EXPECT_EQ(staleness_of(g, 5), 3);
  EXPECT_EQ(staleness_of(g, 1), 0);
  g.episodes.push_back(episode(-1)); // a generator without versions adds none
  EXPECT_EQ(g.oldest_version(), 2);
}

} // namespace
} // namespace rlforge::examples::grpo
