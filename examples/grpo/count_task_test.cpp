#include "examples/grpo/count_task.hpp"
#include "examples/grpo/testing/task_test_support.hpp"

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace rlforge::examples::counting;
using rlforge::examples::grpo::number_tokenizer;
using rlforge::examples::grpo::testing::error_of;
using testing::HasSubstr;

namespace {

std::vector<int64_t> ids(const std::string& text, bool eos) {
  return rlforge::examples::grpo::testing::token_ids<number_tokenizer>(text, eos);
}

std::vector<int64_t> prompt(const std::string& text) {
  auto out = ids(text, false);
  out.insert(out.begin(), number_tokenizer::bos_id);
  return out;
}

} // namespace

TEST(CountTask, PromptAndTargetTokens) {
  const problem p{3, 2, 12};
  EXPECT_EQ(prompt_tokens(p), prompt("3,2,12="));
  EXPECT_EQ(numbers_of(p), (std::vector<int>{3, 5, 7, 9, 11}));
  EXPECT_EQ(target_tokens(p), ids("3,5,7,9,11", true));
  EXPECT_EQ(target_tokens(problem{0, 3, 9}), ids("0,3,6,9", true)); // the end is reached
  EXPECT_EQ(target_tokens(problem{4, 1, 4}), ids("4", true));
  EXPECT_EQ(parse_prompt(prompt("3,2,12=")), p);
  EXPECT_THAT(error_of([] { prompt_tokens(problem{3, 1, 100}); }),
              HasSubstr("count task: the number 100 at position 2 is not in 0..99"));
  EXPECT_THAT(error_of([] { numbers_of(problem{3, 0, 9}); }),
              HasSubstr("needs a step >= 1 and an end not below its start, got from 3 step 0"));
  EXPECT_THAT(error_of([] { target_tokens(problem{9, 1, 3}); }),
              HasSubstr("got from 9 step 1 to 3"));
}

TEST(CountTask, MalformedPromptsAreRefusedSayingWhy) {
  EXPECT_THAT(error_of([] { parse_prompt(ids("3,2,12=", false)); }),
              HasSubstr("does not start with <bos>"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("3,2,12")); }),
              HasSubstr("not <bos> then 2 tokens per number"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("3,2=")); }),
              HasSubstr("it has 2 numbers, not three (start, step, end)"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("3,0,12=")); }), HasSubstr("the step is 0"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("30,1,12=")); }),
              HasSubstr("the end 12 is below the start 30"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("3=2,12,")); }),
              HasSubstr("item 0 is not a number followed by ','"));
  EXPECT_THAT(error_of([] { parse_prompt({1, 999, 4}); }), HasSubstr("(not text: "));
  // Well formed, but not a problem of this configuration.
  task t{task_config{}};
  EXPECT_THAT(error_of([&] { t.reward(prompt("0,4,99="), {}); }),
              HasSubstr("it counts 25 numbers in steps of 4, and the task counts 12-100 in "
                        "steps of 1-3"));
  EXPECT_THAT(error_of([&] { t.target(prompt("3,2,12=")); }),
              HasSubstr("it counts 5 numbers in steps of 2"));
  EXPECT_THAT(error_of([&] { t.accuracy(prompt("1,2"), {}); }), HasSubstr("is not a problem"));
}

TEST(CountTask, RewardIsOneForTheExactCountAndPartialCreditOtherwise) {
  task_config cfg;
  cfg.min_numbers = 4;
  cfg.partial_credit = 0.5;
  task t{cfg};
  const auto p = prompt("10,3,20=");
  EXPECT_EQ(t.target(p), ids("10,13,16,19", true));
  EXPECT_DOUBLE_EQ(t.reward(p, ids("10,13,16,19", true)), 1.0);
  EXPECT_DOUBLE_EQ(t.reward(p, ids("10,13,17,19", true)), 0.5 * 2 / 4);
  EXPECT_DOUBLE_EQ(t.reward(p, ids("10,13,16,19", false)), 0.5 * 3 / 4); // no <eos>
  EXPECT_DOUBLE_EQ(t.reward(p, ids("10,13,16,19,22", true)), 0.5 * 3 / 4); // past the end
  EXPECT_DOUBLE_EQ(t.reward(p, ids("11", true)), 0.0);
  EXPECT_DOUBLE_EQ(t.reward(p, {15, 3, 999, -1}), 0.5 * 1 / 4); // any ids (15: the number 10)
  EXPECT_DOUBLE_EQ(t.accuracy(p, ids("10,13,16,19", true)), 1.0);
  EXPECT_DOUBLE_EQ(t.accuracy(p, ids("10,13,17,19", true)), 0.5);
  EXPECT_DOUBLE_EQ(t.accuracy(p, {}), 0.0);
}

TEST(CountTask, ProblemsHaveAHeavyTailOfAnswerLengthsWithinBounds) {
  task t{task_config{}};
  // Steps 1, 2, 3 with at least 12 numbers: end - start >= 11, 22, 33 respectively, so
  // (1 + ... + 89) + (1 + ... + 78) + (1 + ... + 67) problems.
  EXPECT_EQ(t.problems(), 4005 + 3081 + 2278);
  std::mt19937_64 rng(3);
  std::vector<size_t> counts;
  std::set<int> steps;
  for (int i = 0; i < 4000; ++i) {
    const auto p = t.sample_train(rng);
    const auto numbers = numbers_of(p);
    ASSERT_GE(numbers.size(), 12u);
    ASSERT_LE(numbers.size(), 100u);
    ASSERT_GE(p.from, 0);
    ASSERT_LE(p.to, 99);
    ASSERT_GE(p.step, 1);
    ASSERT_LE(p.step, 3);
    // The end is below the next number: exactly this many numbers.
    ASSERT_GT(numbers.back() + p.step, p.to);
    // A training prompt is a problem of the task.
    ASSERT_EQ(t.target(prompt_tokens(p)), target_tokens(p));
    steps.insert(p.step);
    counts.push_back(numbers.size());
  }
  EXPECT_EQ(steps, (std::set<int>{1, 2, 3}));
  std::sort(counts.begin(), counts.end());
  // u^3 scaling: median 12 + 89/8 ~ 23, 95th percentile ~ 88 (with margin).
  EXPECT_GE(counts[2000], 20u);
  EXPECT_LE(counts[2000], 27u);
  EXPECT_GE(counts[3800], 80u);
  EXPECT_EQ(t.max_answer_tokens(), 200);
  EXPECT_EQ(t.context(), 207);
  EXPECT_EQ(t.description(), "counting 12-100 numbers in 0..99 in steps of 1-3");
}

TEST(CountTask, HeldOutSetIsSeededDistinctAndNeverSampledForTraining) {
  task_config cfg;
  cfg.min_numbers = 90; // 66 problems (all of step 1): collisions with the held-out set are common
  cfg.held_out = 16;
  task a{cfg}, b{cfg};
  EXPECT_EQ(a.problems(), 66);
  EXPECT_EQ(a.held_out_prompts(), b.held_out_prompts());
  const auto held = a.held_out_prompts();
  EXPECT_EQ(std::set<std::vector<int64_t>>(held.begin(), held.end()).size(), 16u);
  cfg.seed = 2;
  EXPECT_NE(task{cfg}.held_out_prompts(), held);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i)
    ASSERT_FALSE(a.is_held_out(a.sample_train(rng)));
}

TEST(CountTask, RefusesBadConfigurations) {
  auto make = [](int lo, int hi, int step, int held, double credit) {
    task_config c;
    c.min_numbers = lo;
    c.max_numbers = hi;
    c.max_step = step;
    c.held_out = held;
    c.partial_credit = credit;
    return error_of([&] { task{c}; });
  };
  EXPECT_THAT(make(1, 8, 3, 10, 0.5), HasSubstr("min_numbers must be >= 2, got 1"));
  EXPECT_THAT(make(8, 7, 3, 10, 0.5), HasSubstr("max_numbers must be in 8..100"));
  EXPECT_THAT(make(8, 101, 3, 10, 0.5), HasSubstr("max_numbers must be in 8..100"));
  EXPECT_THAT(make(8, 40, 0, 10, 0.5), HasSubstr("max_step must be in 1..9, got 0"));
  EXPECT_THAT(make(8, 40, 10, 10, 0.5), HasSubstr("max_step must be in 1..9, got 10"));
  EXPECT_THAT(make(8, 40, 3, 0, 0.5), HasSubstr("held_out must be in 1.."));
  EXPECT_THAT(make(100, 100, 3, 1, 0.5),
              HasSubstr("held_out must be in 1..0 (a quarter of the 1 problems), got 1"));
  EXPECT_THAT(make(90, 100, 1, 17, 0.5),
              HasSubstr("held_out must be in 1..16 (a quarter of the 66 problems), got 17"));
  EXPECT_THAT(make(8, 40, 3, 10, 1.0), HasSubstr("partial_credit must be in [0, 1), got 1"));
  EXPECT_EQ(make(90, 100, 1, 16, 0.0), "no exception");
}
