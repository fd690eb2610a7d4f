// env/in_process_environment.hpp and env/number_guess.hpp: a C++ environment in the driver's
// process.
#include "env/number_guess.hpp"

#include "tests/env/test_support.hpp"

namespace rlforge::env::test {
namespace {

TEST(EnvNumberGuess, PlaysAnEpisodeToSuccess) {
  number_guess g;
  reset_request r;
  r.task = {{"secret", 42}, {"max_turns", 4}};
  const auto start = g.reset(r);
  EXPECT_EQ(start.observation, "I am thinking of a number between 1 and 100. You have 4 guesses. "
                               "Answer with a number.");
  auto s = g.step("maybe 50?");
  EXPECT_EQ(s.observation, "Lower than 50.");
  EXPECT_EQ(s.reward, 0.0);
  EXPECT_FALSE(s.done);
  s = g.step("no idea");
  EXPECT_EQ(s.observation, "I could not find a number in your answer.");
  EXPECT_TRUE(s.info["guess"].is_null());
  s = g.step("between 10 and 42");
  EXPECT_EQ(s.observation, "Correct! The number was 42.");
  EXPECT_EQ(s.reward, 1.0);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.info["turn"], 3);
  expect_env_error([&] { g.step("42"); }, failure::usage, {"without a running episode"});
}

TEST(EnvNumberGuess, EndsAfterMaxTurnsAndDerivesSecretsFromSeeds) {
  number_guess g;
  reset_request r;
  r.seed = 11;
  r.task = {{"max_turns", 2}};
  g.reset(r);
  const int secret = number_guess::secret_for_seed(11);
  EXPECT_GE(secret, 1);
  EXPECT_LE(secret, 100);
  const std::string wrong = std::to_string(secret == 1 ? 2 : 1);
  EXPECT_FALSE(g.step(wrong).done);
  const auto last = g.step(wrong);
  EXPECT_TRUE(last.done);
  EXPECT_NE(last.observation.find("Out of guesses: the number was " + std::to_string(secret)),
            std::string::npos);
  EXPECT_NE(number_guess::secret_for_seed(1), number_guess::secret_for_seed(2));
}

TEST(EnvNumberGuess, ReadsTheLastInteger) {
  int64_t v = 0;
  EXPECT_TRUE(number_guess::last_integer("first 12 then -7", v));
  EXPECT_EQ(v, -7);
  EXPECT_TRUE(number_guess::last_integer("5-3", v));
  EXPECT_EQ(v, -3);
  EXPECT_FALSE(number_guess::last_integer("none", v));
}

TEST(EnvInProcess, KeepsEpisodeBookkeeping) {
  struct counter : in_process_environment {
    counter() : in_process_environment(3) {}
    reset_result on_reset(const reset_request&) override { return {"go", {}}; }
    step_result on_step(const std::string& a) override { return {a, 1.0, false, {}}; }
  } c;
  expect_env_error([&] { c.step("x"); }, failure::usage, {"call reset first"});
  c.reset({});
  EXPECT_FALSE(c.step("a").done);
  EXPECT_FALSE(c.step("b").done);
  EXPECT_TRUE(c.step("c").done); // the turn limit ends the episode
  EXPECT_EQ(c.turns(), 3);
  c.reset({});
  EXPECT_EQ(c.turns(), 0);
  c.close();
  EXPECT_FALSE(c.usable());
  expect_env_error([&] { c.reset({}); }, failure::usage, {"after close"});
}

TEST(EnvNumberGuess, ReportsBadTasksAsEnvironmentErrors) {
  number_guess g;
  reset_request r;
  r.task = {{"secret", 500}};
  expect_env_error([&] { g.reset(r); }, failure::environment, {"task.secret"});
}

} // namespace
} // namespace rlforge::env::test
