#include "examples/grpo/arith_task.hpp"
#include "examples/grpo/testing/task_test_support.hpp"

#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace rlforge::examples::arith;
using testing::HasSubstr;

namespace {

using rlforge::examples::grpo::testing::error_of;

std::vector<int64_t> ids(const std::string& text, bool eos) {
  return rlforge::examples::grpo::testing::token_ids<tokenizer>(text, eos);
}

} // namespace

TEST(ArithTask, TokenizerRoundTripsTheAlphabet) {
  auto t = tokenizer::encode("0123456789+-*=");
  ASSERT_EQ(t.size(), 14u);
  std::set<int64_t> distinct(t.begin(), t.end());
  EXPECT_EQ(distinct.size(), 14u);
  for (auto id : t) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, tokenizer::vocab_size());
  }
  EXPECT_EQ(tokenizer::decode(t), "0123456789+-*=");
  EXPECT_EQ(tokenizer::decode({tokenizer::bos_id, t[3], tokenizer::eos_id, tokenizer::pad_id}),
            "<bos>3<eos><pad>");
}

TEST(ArithTask, TokenizerRefusesUnknownCharactersAndIds) {
  auto e = error_of([] { tokenizer::encode("12/4="); });
  EXPECT_THAT(e, HasSubstr("'/'"));
  EXPECT_THAT(e, HasSubstr("position 2"));
  EXPECT_THAT(error_of([] { tokenizer::encode("1 2"); }), HasSubstr("' '"));
  EXPECT_THAT(error_of([] { tokenizer::decode({3, 17}); }), HasSubstr("id 17 at position 1"));
  EXPECT_THAT(error_of([] { tokenizer::decode({-1}); }), HasSubstr("id -1"));
}

TEST(ArithTask, ProblemTextAndTokens) {
  problem p{37, 48, '+'};
  EXPECT_EQ(p.prompt_text(), "37+48=");
  EXPECT_EQ(p.answer_text(), "85");
  EXPECT_EQ(tokenizer::decode(prompt_tokens(p)), "<bos>37+48=");
  EXPECT_EQ(tokenizer::decode(target_tokens(p)), "85<eos>");
  problem s{3, 14, '-'};
  EXPECT_EQ(s.answer(), -11);
  EXPECT_EQ(tokenizer::decode(target_tokens(s)), "-11<eos>");
  EXPECT_EQ((problem{12, 12, '*'}).answer(), 144);
  EXPECT_THAT(error_of([] { (problem{1, 2, '/'}).answer(); }), HasSubstr("'/'"));
}

TEST(ArithTask, HeldOutSetIsSeededDistinctAndNeverSampledForTraining) {
  task_config cfg;
  cfg.digits = 2;
  cfg.held_out = 300;
  cfg.seed = 5;
  task t(cfg);
  ASSERT_EQ(t.held_out().size(), 300u);
  std::set<problem> distinct(t.held_out().begin(), t.held_out().end());
  EXPECT_EQ(distinct.size(), 300u);
  EXPECT_EQ(t.total_problems(), 10000);
  // The same seed gives the same split, another seed another one.
  EXPECT_EQ(task(cfg).held_out(), t.held_out());
  cfg.seed = 6;
  EXPECT_NE(task(cfg).held_out(), t.held_out());
  std::mt19937_64 rng(1);
  std::set<problem> seen;
  for (int i = 0; i < 20000; ++i) {
    auto p = t.sample_train(rng);
    ASSERT_FALSE(t.is_held_out(p)) << p.prompt_text();
    ASSERT_GE(p.a, 0);
    ASSERT_LT(p.a, 100);
    ASSERT_GE(p.b, 0);
    ASSERT_LT(p.b, 100);
    ASSERT_EQ(p.op, '+');
    seen.insert(p);
  }
  // Training draws cover most of the 9700 training problems.
  EXPECT_GT(seen.size(), 8000u);
  EXPECT_TRUE(t.is_held_out(t.held_out().front()));
}

TEST(ArithTask, AnswerBudgetCoversTheWidestAnswer) {
  EXPECT_EQ(task(task_config{2, "+", 10, 1}).max_answer_tokens(), 4);  // "198" + eos
  EXPECT_EQ(task(task_config{2, "-", 10, 1}).max_answer_tokens(), 4);  // "-99" + eos
  EXPECT_EQ(task(task_config{2, "+*", 10, 1}).max_answer_tokens(), 5); // "9801" + eos
  EXPECT_EQ(task(task_config{1, "+", 1, 1}).max_answer_tokens(), 3);   // "18" + eos
}

TEST(ArithTask, RefusesBadConfigurations) {
  EXPECT_THAT(error_of([] { task(task_config{0, "+", 10, 1}); }), HasSubstr("digits"));
  EXPECT_THAT(error_of([] { task(task_config{5, "+", 10, 1}); }), HasSubstr("got 5"));
  EXPECT_THAT(error_of([] { task(task_config{2, "", 10, 1}); }), HasSubstr("ops is empty"));
  EXPECT_THAT(error_of([] { task(task_config{2, "+/", 10, 1}); }), HasSubstr("'/'"));
  EXPECT_THAT(error_of([] { task(task_config{2, "++", 10, 1}); }), HasSubstr("repeated"));
  EXPECT_THAT(error_of([] { task(task_config{2, "+", 0, 1}); }), HasSubstr("held_out"));
  EXPECT_THAT(error_of([] { task(task_config{1, "+", 26, 1}); }), HasSubstr("1..25"));
}

TEST(ArithTask, ParsesWellFormedAnswersOnly) {
  EXPECT_EQ(parse_answer(ids("85", true)), 85);
  EXPECT_EQ(parse_answer(ids("-11", true)), -11);
  EXPECT_EQ(parse_answer(ids("007", true)), 7);
  EXPECT_FALSE(parse_answer(ids("85", false)));                   // no eos
  EXPECT_FALSE(parse_answer(ids("", true)));                      // eos alone
  EXPECT_FALSE(parse_answer(ids("-", true)));                     // sign alone
  EXPECT_FALSE(parse_answer(ids("8+5", true)));                   // stray symbol
  EXPECT_FALSE(parse_answer(ids("12345678901", true)));           // too long
  EXPECT_FALSE(parse_answer({tokenizer::eos_id, 5, tokenizer::eos_id}));
  EXPECT_FALSE(parse_answer({5, 99, tokenizer::eos_id}));         // outside the vocabulary
}

TEST(ArithTask, RewardIsOneOnlyForTheExactAnswerWithEos) {
  problem p{37, 48, '+'};
  EXPECT_EQ(reward(p, ids("85", true)), 1.0);
  EXPECT_EQ(reward(p, ids("85", false)), 0.0);
  EXPECT_EQ(reward(p, ids("86", true)), 0.0);
  EXPECT_EQ(reward(p, ids("085", true)), 0.0); // a correct number, not the exact answer
  EXPECT_EQ(reward(p, ids("85", true), 0.1), 1.0);
  EXPECT_DOUBLE_EQ(reward(p, ids("86", true), 0.1), 0.1);
  EXPECT_EQ(reward(p, ids("8=", true), 0.1), 0.0);
  EXPECT_EQ(reward(p, {}, 0.1), 0.0);
  EXPECT_THAT(error_of([&] { reward(p, ids("85", true), 1.0); }), HasSubstr("format_reward"));
  EXPECT_THAT(error_of([&] { reward(p, ids("85", true), -0.5); }), HasSubstr("-0.5"));
}

TEST(ArithTask, AsAVerifiableTaskItsPromptsCarryTheirProblem) {
  task t{task_config{2, "+-", 10, 1}};
  const problem p{37, 48, '-'};
  EXPECT_EQ(parse_prompt(prompt_tokens(p)), p);
  EXPECT_EQ(t.target(prompt_tokens(p)), ids("-11", true));
  EXPECT_DOUBLE_EQ(t.reward(prompt_tokens(p), ids("-11", true)), 1.0);
  EXPECT_DOUBLE_EQ(t.reward(prompt_tokens(p), ids("11", true)), 0.0);
  std::mt19937_64 a(4), b(4);
  EXPECT_EQ(t.sample_prompt(a), prompt_tokens(t.sample_train(b))); // the same draws
  ASSERT_EQ(t.held_out_prompts().size(), 10u);
  EXPECT_EQ(t.held_out_prompts()[3], prompt_tokens(t.held_out()[3]));
  EXPECT_EQ(t.description(), "2-digit arithmetic (+-)");
  EXPECT_EQ((task{task_config{2, "+", 10, 1}}.description()), "2-digit addition");
  EXPECT_EQ(t.context(), 2 * 2 + 3 + 4); // <bos>37-48= then "-99<eos>"
  EXPECT_THAT(error_of([] { parse_prompt(ids("1+2=", false)); }),
              HasSubstr("does not start with <bos>"));
  EXPECT_THAT(error_of([] { parse_prompt({1, 4, 13, 5}); }), HasSubstr("does not end with '='"));
  EXPECT_THAT(error_of([] { parse_prompt({1, 4, 4, 16}); }), HasSubstr("is not a<op>b="));
  EXPECT_THAT(error_of([] { parse_prompt({1, 4, 13, 17, 16}); }),
              HasSubstr("id 17 at position 3 is outside the vocabulary"));
}

TEST(ArithTask, AccuracyCountsExactAnswers) {
  task t{task_config{2, "+", 1, 1}};
  std::vector<problem> ps{{1, 2, '+'}, {10, 20, '+'}, {5, 5, '+'}, {9, 9, '+'}};
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : ps)
    prompts.push_back(prompt_tokens(p));
  std::vector<std::vector<int64_t>> rs{ids("3", true), ids("30", true), ids("11", true),
                                       ids("18", false)};
  using rlforge::examples::grpo::mean_accuracy;
  EXPECT_DOUBLE_EQ(mean_accuracy(t, prompts, rs), 0.5);
  rs.pop_back();
  EXPECT_THAT(error_of([&] { mean_accuracy(t, prompts, rs); }),
              HasSubstr("4 prompts but 3 responses"));
  EXPECT_THAT(error_of([&] { mean_accuracy(t, {}, {}); }), HasSubstr("no prompts"));
}
