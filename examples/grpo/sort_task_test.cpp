#include "examples/grpo/sort_task.hpp"
#include "examples/grpo/testing/task_test_support.hpp"

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace rlforge::examples::sorting;
using testing::HasSubstr;

namespace {

using rlforge::examples::grpo::testing::error_of;

std::vector<int64_t> ids(const std::string& text, bool eos) {
  return rlforge::examples::grpo::testing::token_ids<tokenizer>(text, eos);
}

std::vector<int64_t> prompt(const std::string& text) {
  auto out = ids(text, false);
  out.insert(out.begin(), tokenizer::bos_id);
  return out;
}

} // namespace

TEST(SortTask, PromptAndTargetTokens) {
  EXPECT_EQ(prompt_tokens({37, 5, 82}), prompt("37,5,82="));
  EXPECT_EQ(target_tokens({37, 5, 82}), ids("5,37,82", true));
  EXPECT_EQ(parse_prompt(prompt("37,5,82=")), (std::vector<int>{37, 5, 82}));
  EXPECT_THAT(error_of([] { prompt_tokens({3, 100}); }),
              HasSubstr("the number 100 at position 1 is not in 0..99"));
}

TEST(SortTask, MalformedPromptsAreRefusedSayingWhy) {
  EXPECT_THAT(error_of([] { parse_prompt(ids("37,5=", false)); }),
              HasSubstr("does not start with <bos>"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("37,5")); }),
              HasSubstr("not <bos> then 2 tokens per number"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("37=5,")); }),
              HasSubstr("item 0 is not a number followed by ','"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("37,5,")); }),
              HasSubstr("item 1 is not a number followed by '='"));
  EXPECT_THAT(error_of([] { parse_prompt(prompt("37,5,37=")); }),
              HasSubstr("the number 37 repeats"));
  EXPECT_THAT(error_of([] { parse_prompt({1, 999, 4}); }), HasSubstr("(not text: "));
  task t{task_config{}};
  EXPECT_THAT(error_of([&] { t.reward(prompt("1,2"), {}); }), HasSubstr("is not a list"));
}

TEST(SortTask, RewardIsOneForTheSortedListAndPartialCreditOtherwise) {
  task_config cfg;
  cfg.partial_credit = 0.5;
  task t{cfg};
  const auto p = prompt("37,5,82,6=");
  EXPECT_EQ(t.target(p), ids("5,6,37,82", true));
  EXPECT_DOUBLE_EQ(t.reward(p, ids("5,6,37,82", true)), 1.0);
  // Numbers in place before the first mistake, each with its ',' (or <eos> for the last).
  EXPECT_DOUBLE_EQ(t.reward(p, ids("5,6,82,37", true)), 0.5 * 2 / 4);
  EXPECT_DOUBLE_EQ(t.reward(p, ids("5,37,82", true)), 0.5 * 1 / 4);
  EXPECT_DOUBLE_EQ(t.reward(p, ids("5,6,37,82", false)), 0.5 * 3 / 4); // no <eos>
  EXPECT_DOUBLE_EQ(t.reward(p, ids("5,6,37,82,", false)), 0.5 * 3 / 4);
  EXPECT_DOUBLE_EQ(t.reward(p, ids("82,5", true)), 0.0);
  EXPECT_DOUBLE_EQ(t.reward(p, {}), 0.0);
  // Anything a sampler returns is scored, ids outside the vocabulary too.
  EXPECT_DOUBLE_EQ(t.reward(p, {10, 3, 999, -1}), 0.5 * 1 / 4);
  // Every number in place but more after <eos>: not exact.
  auto longer = ids("5,6,37,82", true);
  longer.push_back(7);
  EXPECT_DOUBLE_EQ(t.reward(p, longer), 0.5 * 3 / 4);
  EXPECT_EQ(numbers_in_place({37, 5, 82, 6}, ids("5,6,37,82", true)), 4);
  // Held-out accuracy: the share in place, 1 only for the exact answer.
  EXPECT_DOUBLE_EQ(t.accuracy(p, ids("5,6,37,82", true)), 1.0);
  EXPECT_DOUBLE_EQ(t.accuracy(p, ids("5,6,82,37", true)), 0.5);
  EXPECT_DOUBLE_EQ(t.accuracy(p, longer), 0.75);
  EXPECT_DOUBLE_EQ(t.accuracy(p, {}), 0.0);
}

TEST(SortTask, ListsAreDistinctWithAHeavyTailOfLengthsWithinBounds) {
  task t{task_config{}};
  std::mt19937_64 rng(3);
  std::vector<size_t> lengths;
  for (int i = 0; i < 4000; ++i) {
    auto list = t.sample_train(rng);
    ASSERT_GE(list.size(), 12u);
    ASSERT_LE(list.size(), 80u);
    ASSERT_EQ(std::set<int>(list.begin(), list.end()).size(), list.size());
    for (int x : list) {
      ASSERT_GE(x, 0);
      ASSERT_LE(x, 99);
    }
    lengths.push_back(list.size());
  }
  std::sort(lengths.begin(), lengths.end());
  const auto median = lengths[lengths.size() / 2];
  const auto p95 = lengths[lengths.size() * 95 / 100];
  // u^3 scaling: median 12 + 69/8 ~ 20, 95th percentile 12 + 69 * 0.95^3 ~ 71 (with margin).
  EXPECT_GE(median, 17u);
  EXPECT_LE(median, 24u);
  EXPECT_GE(p95, 64u);
  EXPECT_EQ(lengths.back(), 80u);
  // Answers: 2 tokens per number, <eos> in place of the last ','.
  EXPECT_EQ(t.max_answer_tokens(), 160);
  EXPECT_EQ(t.context(), 321);
  EXPECT_EQ(t.description(), "sorting lists of 12-80 distinct numbers in 0..99");
}

TEST(SortTask, HeldOutSetIsSeededDistinctAndNeverSampledForTraining) {
  task_config cfg;
  cfg.min_numbers = 2;
  cfg.max_numbers = 2; // 9,900 lists: collisions with the held-out set are common
  cfg.held_out = 2000;
  task a{cfg}, b{cfg};
  EXPECT_EQ(a.held_out_prompts(), b.held_out_prompts());
  const auto held = a.held_out_prompts();
  EXPECT_EQ(std::set<std::vector<int64_t>>(held.begin(), held.end()).size(), 2000u);
  cfg.seed = 2;
  EXPECT_NE(task{cfg}.held_out_prompts(), held);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 5000; ++i)
    ASSERT_FALSE(a.is_held_out(a.sample_train(rng)));
}

TEST(SortTask, RefusesBadConfigurations) {
  auto make = [](int lo, int hi, int held, double credit) {
    task_config c;
    c.min_numbers = lo;
    c.max_numbers = hi;
    c.held_out = held;
    c.partial_credit = credit;
    return error_of([&] { task{c}; });
  };
  EXPECT_THAT(make(1, 8, 10, 0.5), HasSubstr("min_numbers must be >= 2, got 1"));
  EXPECT_THAT(make(8, 7, 10, 0.5), HasSubstr("max_numbers must be in 8..100"));
  EXPECT_THAT(make(8, 101, 10, 0.5), HasSubstr("max_numbers must be in 8..100"));
  EXPECT_THAT(make(8, 40, 0, 0.5), HasSubstr("held_out must be in 1..100000, got 0"));
  EXPECT_THAT(make(2, 2, 2476, 0.5), HasSubstr("held_out must be in 1..2475, got 2476"));
  EXPECT_THAT(make(8, 40, 10, 1.0), HasSubstr("partial_credit must be in [0, 1), got 1"));
  EXPECT_EQ(make(2, 2, 2475, 0.0), "no exception");
}
