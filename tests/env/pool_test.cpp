// env/pool.hpp: many episodes at once, against the same episodes run alone, with failures
// isolated to their episodes.
#include "env/pool.hpp"

#include <atomic>
#include <memory>

#include "env/number_guess.hpp"
#include "tests/env/test_support.hpp"

namespace rlforge::env::test {
namespace {

class EnvPool : public env_test {};

/// A deterministic policy for the guessing game: binary search on the observations so far.
std::string bisect(std::size_t, const episode_record& rec) {
  int lo = 1, hi = 100;
  for (const auto& t : rec.turns) {
    int64_t guess = 0;
    number_guess::last_integer(t.action, guess);
    if (t.result.observation.rfind("Higher", 0) == 0)
      lo = static_cast<int>(guess) + 1;
    else if (t.result.observation.rfind("Lower", 0) == 0)
      hi = static_cast<int>(guess) - 1;
  }
  return "I say " + std::to_string((lo + hi) / 2);
}

std::vector<reset_request> requests(int n) {
  std::vector<reset_request> out;
  for (int i = 0; i < n; ++i) {
    reset_request r;
    r.seed = 1000 + i;
    r.task = {{"max_turns", 3 + i % 4}};
    out.push_back(r);
  }
  return out;
}

void expect_same(const std::vector<episode_record>& a, const std::vector<episode_record>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(a[i].error) << i << ": " << a[i].error->what();
    EXPECT_FALSE(b[i].error) << i << ": " << b[i].error->what();
    EXPECT_EQ(a[i].start.observation, b[i].start.observation);
    ASSERT_EQ(a[i].turns.size(), b[i].turns.size()) << i;
    for (std::size_t k = 0; k < a[i].turns.size(); ++k) {
      EXPECT_EQ(a[i].turns[k].action, b[i].turns[k].action);
      EXPECT_EQ(a[i].turns[k].result.observation, b[i].turns[k].result.observation);
      EXPECT_EQ(a[i].turns[k].result.reward, b[i].turns[k].result.reward);
    }
    EXPECT_EQ(a[i].total_reward, b[i].total_reward);
    EXPECT_EQ(a[i].done, b[i].done);
  }
}

TEST_F(EnvPool, ConcurrentEpisodesMatchTheSameEpisodesRunAlone) {
  RLFORGE_REQUIRE_PYTHON();
  const auto reqs = requests(12);
  std::vector<episode_record> alone;
  {
    environment_pool one(subprocess_factory(guess_number()), 1);
    alone = one.run_episodes(reqs, bisect, 0);
  }
  std::vector<episode_record> together;
  {
    environment_pool four(subprocess_factory(guess_number()), 4);
    together = four.run_episodes(reqs, bisect, 0);
  }
  expect_same(alone, together);
  // And the in-process C++ game agrees with the Python process.
  environment_pool cpp([] { return std::make_unique<number_guess>(); }, 3);
  expect_same(alone, cpp.run_episodes(reqs, bisect, 0));
  int solved = 0;
  for (const auto& r : alone)
    solved += r.total_reward > 0;
  EXPECT_GT(solved, 0);
  EXPECT_LT(solved, 12); // some episodes run out of turns: both endings are exercised
}

TEST_F(EnvPool, AFailingEpisodeDoesNotStopTheOthersAndItsProcessIsReplaced) {
  RLFORGE_REQUIRE_PYTHON();
  // The first three environments crash mid-episode; every later one is the real game. Each
  // crashing one fails exactly one episode and must be replaced by a fresh process.
  std::atomic<int> made{0};
  auto factory = [&]() -> std::unique_ptr<environment> {
    const int n = made++;
    return std::make_unique<subprocess_environment>(n < 3 ? misbehaving("exit_mid_episode")
                                                          : guess_number());
  };
  environment_pool pool(factory, 3);
  const auto reqs = requests(9);
  const auto records = pool.run_episodes(reqs, bisect, 0);
  int failed = 0;
  for (const auto& r : records) {
    if (r.error) {
      ++failed;
      EXPECT_EQ(r.error->kind(), failure::crashed) << r.error->what();
      EXPECT_NE(std::string(r.error->what()).find("fatal: boom"), std::string::npos);
    } else {
      EXPECT_TRUE(r.done);
    }
  }
  EXPECT_GE(failed, 1);
  EXPECT_LE(failed, 3);
  EXPECT_GT(made.load(), 3); // dead processes were replaced by fresh ones
}

TEST_F(EnvPool, EnvironmentErrorsStayInTheirEpisode) {
  RLFORGE_REQUIRE_PYTHON();
  environment_pool pool(subprocess_factory(guess_number()), 2);
  auto reqs = requests(4);
  reqs[1].task = {{"secret", 0}}; // refused by the environment
  const auto records = pool.run_episodes(reqs, bisect, 0);
  ASSERT_TRUE(records[1].error);
  EXPECT_EQ(records[1].error->kind(), failure::environment);
  for (std::size_t i : {0u, 2u, 3u})
    EXPECT_TRUE(records[i].done && !records[i].error) << i;
}

TEST_F(EnvPool, LockstepBatchStepsEveryRunningEpisodeAtOnce) {
  RLFORGE_REQUIRE_PYTHON();
  environment_pool pool(subprocess_factory(guess_number()), 6);
  const auto reqs = requests(6);
  episode_batch batch(pool, reqs);
  std::vector<episode_record> shadow(reqs.size());
  int rounds = 0;
  while (!batch.running().empty()) {
    ASSERT_LT(++rounds, 20);
    std::vector<std::string> actions(reqs.size());
    for (std::size_t i : batch.running())
      actions[i] = bisect(i, batch.episodes()[i]);
    batch.step(actions);
  }
  environment_pool one(subprocess_factory(guess_number()), 1);
  expect_same(one.run_episodes(reqs, bisect, 0), batch.episodes());
  expect_env_error([&] { episode_batch too_big(pool, requests(7)); }, failure::usage,
                   {"needs a pool of at least that many"});
}

TEST_F(EnvPool, TheDriverCanStopAnEpisodeAndReuseItsEnvironment) {
  environment_pool pool([] { return std::make_unique<number_guess>(); }, 3);
  const auto reqs = requests(3);
  {
    episode_batch batch(pool, reqs);
    std::vector<std::string> actions(reqs.size(), "I guess 0");
    batch.step(actions);
    batch.stop(1);
    EXPECT_EQ(batch.running(), (std::vector<std::size_t>{0, 2}));
    expect_env_error([&] { batch.stop(1); }, failure::usage, {"episode 1 is not running"});
    expect_env_error([&] { batch.stop(3); }, failure::usage, {"no episode 3 in a batch of 3"});
    while (!batch.running().empty()) {
      for (std::size_t i : batch.running())
        actions[i] = bisect(i, batch.episodes()[i]);
      actions[1] = "ignored: episode 1 is not running";
      batch.step(actions);
    }
    const auto& stopped = batch.episodes()[1];
    EXPECT_TRUE(stopped.stopped);
    EXPECT_FALSE(stopped.done);
    EXPECT_FALSE(stopped.error);
    EXPECT_EQ(stopped.turns.size(), 1u);
    for (std::size_t i : {0u, 2u})
      EXPECT_TRUE(batch.episodes()[i].done && !batch.episodes()[i].stopped) << i;
  }
  // The stopped episode's environment went back to the pool: a full batch runs again.
  episode_batch again(pool, reqs);
  EXPECT_EQ(again.running().size(), 3u);
}

TEST_F(EnvPool, SpawnFailuresAreRecordedPerEpisode) {
  subprocess_options o;
  o.process.argv = {"/nonexistent/env"};
  environment_pool pool(subprocess_factory(o), 2);
  const auto records = pool.run_episodes(requests(3), bisect, 0);
  for (const auto& r : records) {
    ASSERT_TRUE(r.error);
    EXPECT_EQ(r.error->kind(), failure::spawn);
  }
}

} // namespace
} // namespace rlforge::env::test
