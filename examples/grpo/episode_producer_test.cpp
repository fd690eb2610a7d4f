// The --env job's episode producer with a runner standing in for engines and environments:
// groups are taken in the order they finish (a slow one holds no take back), staler groups are
// dropped and counted, every group asked for is taken, dropped or still held, a runner's
// failure and a timeout are clear errors, bad arguments are refused, and a state saved through
// JSON (episode_json.hpp) resumes in a fresh producer without losing or repeating a group.
#include "examples/grpo/episode_producer.hpp"

#include "examples/grpo/episode_json.hpp"

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

TEST(EpisodeProducer, AStateRoundTripsThroughJsonAndAResumeLosesNoGroup) {
  gate slow;
  std::atomic<int> ran{0};
  std::set<int64_t> trained;
  producer_state saved;
  {
    episode_producer p(
        [&](const episode_group& g) {
          if (g.id == 1)
            slow.wait(); // still running at the snapshot
          auto out = std::vector<episode_sample>{episode(2), episode(3)};
          out[1].error = "the environment crashed";
          ++ran;
          return out;
        },
        2);
    for (int64_t id = 0; id < 5; ++id)
      p.add(group(id));
    trained.insert(p.take(1, 3, 1, 60s).groups.at(0).id);
    while (ran.load() < 4) // every group but the slow one
      std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms); // the last one is stored after its runner returns
    const auto text = to_json(p.state()).dump();
    saved = producer_state_from_json(nlohmann::json::parse(text));
    EXPECT_EQ(to_json(saved).dump(), text);
    slow.release();
  }
  ASSERT_EQ(saved.unfinished.size(), 1u);
  EXPECT_EQ(saved.unfinished[0].id, 1);
  EXPECT_TRUE(saved.unfinished[0].episodes.empty());
  EXPECT_EQ(saved.unfinished[0].request.seed, 1);
  ASSERT_EQ(saved.finished.size(), 3u);
  const auto& e = saved.finished[0].episodes.at(1);
  EXPECT_EQ(e.versions, (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(e.logprobs, (std::vector<double>{0.0, -0.5}));
  EXPECT_EQ(e.error, std::optional<std::string>{"the environment crashed"});
  EXPECT_EQ(saved.totals.taken, 1);

  // A fresh producer (a resumed job) runs the unfinished group again from its start and hands
  // out the finished ones as they were: every group once, none lost.
  std::vector<int64_t> rerun;
  std::mutex rerun_mutex;
  episode_producer resumed(
      [&](const episode_group& g) {
        std::lock_guard<std::mutex> lock(rerun_mutex);
        rerun.push_back(g.id);
        return std::vector<episode_sample>{episode(4)};
      },
      2);
  resumed.restore(saved);
  EXPECT_EQ(resumed.held(), 4u);
  for (const auto& g : resumed.take(4, 4, 2, 60s).groups)
    EXPECT_TRUE(trained.insert(g.id).second) << "group " << g.id << " taken twice";
  EXPECT_EQ(trained, (std::set<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(rerun, (std::vector<int64_t>{1}));
  EXPECT_EQ(resumed.accounting().taken, 5);
  try {
    resumed.restore(saved);
    ADD_FAILURE() << "restored into a producer that has taken groups";
  } catch (const std::invalid_argument& x) {
    EXPECT_THAT(x.what(), HasSubstr("restore needs a fresh producer"));
  }
  auto twice = saved;
  twice.finished.push_back(twice.finished.front());
  episode_producer fresh([](const episode_group&) { return std::vector<episode_sample>{}; }, 1);
  try {
    fresh.restore(twice);
    ADD_FAILURE() << "restored a group twice";
  } catch (const std::invalid_argument& x) {
    EXPECT_THAT(x.what(), HasSubstr("appears twice"));
  }
  EXPECT_EQ(fresh.held(), 0u); // nothing loaded
}

TEST(EpisodeJson, NamesWhatIsWrong) {
  producer_state s;
  s.finished.push_back(group(4));
  s.finished[0].episodes.push_back(episode(1));
  auto good = to_json(s);
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      producer_state_from_json(j);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(error_of(good), "accepted");
  EXPECT_THAT(error_of(nlohmann::json::array()), HasSubstr("not a JSON object"));
  auto j = good;
  j.erase("unfinished");
  EXPECT_THAT(error_of(j), HasSubstr("state.unfinished must be an array"));
  j = good;
  j["finished"][0]["episodes"][0].erase("reward");
  EXPECT_THAT(error_of(j), HasSubstr("state.finished[0].episodes[0].reward is missing"));
  j = good;
  j["finished"][0]["episodes"][0]["versions"] = {1};
  EXPECT_THAT(error_of(j), HasSubstr("has 2 response tokens but per-token lists of 1"));
  j = good;
  j["finished"][0]["id"] = "four";
  EXPECT_THAT(error_of(j), HasSubstr("state.finished[0].id has the wrong type (string)"));
  j = good;
  j.erase("taken");
  EXPECT_THAT(error_of(j), HasSubstr("state.taken is missing"));
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
