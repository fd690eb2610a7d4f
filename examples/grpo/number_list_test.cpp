#include "examples/grpo/number_list.hpp"
#include "examples/grpo/testing/task_test_support.hpp"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace rlforge::examples::grpo;
using rlforge::examples::grpo::testing::error_of;
using ::testing::HasSubstr;

namespace {

std::vector<int64_t> ids(const std::string& text, bool eos) {
  return rlforge::examples::grpo::testing::token_ids<number_tokenizer>(text, eos);
}

} // namespace

TEST(NumberList, TokenizerHasOneIdPerNumber) {
  using tokenizer = number_tokenizer;
  auto t = tokenizer::encode("0,99,5=");
  EXPECT_EQ(t, (std::vector<int64_t>{5, 3, 104, 3, 10, 4}));
  EXPECT_EQ(tokenizer::decode(t), "0,99,5=");
  std::set<int64_t> all;
  for (int x = 0; x < 100; ++x)
    all.insert(tokenizer::encode(std::to_string(x)).at(0));
  EXPECT_EQ(all.size(), 100u);
  EXPECT_EQ(*all.rbegin(), tokenizer::vocab_size() - 1);
  EXPECT_EQ(tokenizer::decode({1, 2, 0}), "<bos><eos><pad>");
  EXPECT_THAT(error_of([] { tokenizer::encode("12+3"); }),
              HasSubstr("character '+' at position 2 is not in the alphabet"));
  EXPECT_THAT(error_of([] { tokenizer::encode("1,100"); }),
              HasSubstr("the number 100 at position 2 is not in 0..99"));
  EXPECT_THAT(error_of([] { tokenizer::encode("05"); }), HasSubstr("without a leading zero"));
  EXPECT_THAT(error_of([] {
                tokenizer::decode({3, 105});
              }),
              HasSubstr("id 105 at position 1 is outside the vocabulary [0, 105)"));
}

TEST(NumberList, PromptsAndAnswersReadBackOrSayWhyNot) {
  auto p = number_prompt({7, 0, 99}, "test");
  EXPECT_EQ(number_tokenizer::decode(p), "<bos>7,0,99=");
  EXPECT_EQ(number_answer({7, 0, 99}, "test"), ids("7,0,99", true));
  std::vector<int> back;
  EXPECT_EQ(read_number_prompt(p, back), "");
  EXPECT_EQ(back, (std::vector<int>{7, 0, 99}));
  EXPECT_THAT(error_of([] {
                number_answer({1, -1}, "who");
              }),
              HasSubstr("who: the number -1 at position 1 is not in 0..99"));
  EXPECT_EQ(read_number_prompt(ids("7=", false), back), "it does not start with <bos>");
  EXPECT_TRUE(back.empty());
  auto open_ended = p;
  open_ended.back() = number_tokenizer::comma_id;
  EXPECT_EQ(read_number_prompt(open_ended, back), "item 2 is not a number followed by '='");
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(shown_ids({1, 999}), "(not text: number tokenizer: id 999 at position 1 is outside "
                                 "the vocabulary [0, 105))");
}

TEST(NumberList, NumbersInPlaceCountLeadingNumbersAndTheEndOfSequence) {
  const auto answer = ids("3,5,7", true);
  EXPECT_EQ(numbers_in_place(answer, answer), 3);
  EXPECT_EQ(numbers_in_place(answer, ids("3,5,8", true)), 2);
  EXPECT_EQ(numbers_in_place(answer, ids("3,5,7", false)), 2);  // no <eos>
  EXPECT_EQ(numbers_in_place(answer, ids("3,5,7,9", true)), 2); // more after the last
  EXPECT_EQ(numbers_in_place(answer, ids("5", true)), 0);
  EXPECT_EQ(numbers_in_place(answer, {}), 0);
  EXPECT_EQ(numbers_in_place(answer, {8, 3, -4, 999}), 1); // any ids
  EXPECT_EQ(numbers_in_place({}, ids("3", true)), 0);
}

TEST(NumberList, HeavyTailedLengthsStayInBoundsWithAFewLong) {
  std::mt19937_64 rng(7);
  std::vector<int> n;
  for (int i = 0; i < 4000; ++i)
    n.push_back(heavy_tailed_length(rng, 12, 100));
  std::sort(n.begin(), n.end());
  EXPECT_GE(n.front(), 12);
  EXPECT_LE(n.back(), 100);
  // u^3: median 12 + 89/8 ~ 23, 95th percentile 12 + 89 * 0.95^3 ~ 88 (with margin).
  EXPECT_GE(n[2000], 20);
  EXPECT_LE(n[2000], 27);
  EXPECT_GE(n[3800], 80);
  EXPECT_EQ(heavy_tailed_length(rng, 5, 5), 5);
}
