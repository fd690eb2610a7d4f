#include "examples/grpo/options.hpp"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace rlforge::examples::grpo;
using testing::HasSubstr;

TEST(GrpoOptions, DefaultsAreTheFullRun) {
  auto r = parse_options({});
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_FALSE(r.opts.quick);
  EXPECT_EQ(r.opts.steps, options{}.steps);
  EXPECT_EQ(r.opts.group, options{}.group);
  EXPECT_FALSE(r.help);
}

TEST(GrpoOptions, ParsesEveryFlag) {
  auto r = parse_options({"--steps", "7", "--seed", "42", "--metrics", "m.jsonl", "--plot",
                          "p.png", "--quiet", "--digits", "3", "--held-out", "99",
                          "--sft-steps", "0", "--sft-batch", "16", "--sft-lr", "0.01",
                          "--prompts", "5", "--group", "2", "--lr", "1e-4", "--temperature",
                          "1.5", "--kl-coef", "0", "--sft-target", "0.5", "--epochs", "3"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  const auto& o = r.opts;
  EXPECT_EQ(o.steps, 7);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.metrics, "m.jsonl");
  EXPECT_EQ(o.plot, "p.png");
  EXPECT_TRUE(o.quiet);
  EXPECT_EQ(o.digits, 3);
  EXPECT_EQ(o.held_out, 99);
  EXPECT_EQ(o.sft_steps, 0);
  EXPECT_EQ(o.sft_batch, 16);
  EXPECT_DOUBLE_EQ(o.sft_lr, 0.01);
  EXPECT_EQ(o.prompts, 5);
  EXPECT_EQ(o.group, 2);
  EXPECT_DOUBLE_EQ(o.lr, 1e-4);
  EXPECT_DOUBLE_EQ(o.temperature, 1.5);
  EXPECT_DOUBLE_EQ(o.kl_coef, 0.0);
  EXPECT_DOUBLE_EQ(o.sft_target, 0.5);
  EXPECT_EQ(o.epochs, 3);
}

TEST(GrpoOptions, QuickShrinksTheRunAndLaterFlagsStillApply) {
  auto q = parse_options({"--quick"});
  ASSERT_TRUE(q.error.empty()) << q.error;
  EXPECT_TRUE(q.opts.quick);
  EXPECT_LT(q.opts.steps, options{}.steps);
  EXPECT_LT(q.opts.sft_steps, options{}.sft_steps);
  EXPECT_LT(q.opts.prompts, options{}.prompts);
  // The position of --quick does not matter: explicit flags win.
  auto r = parse_options({"--steps", "9", "--quick"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.opts.steps, 9);
  EXPECT_EQ(r.opts.sft_steps, q.opts.sft_steps);
}

TEST(GrpoOptions, RefusesBadArguments) {
  auto err = [](std::vector<std::string> args) { return parse_options(args).error; };
  EXPECT_THAT(err({"--bogus"}), HasSubstr("unknown argument '--bogus'"));
  EXPECT_THAT(err({"--steps"}), HasSubstr("--steps needs a value"));
  EXPECT_THAT(err({"--steps", "0"}), HasSubstr("--steps must be an integer in [1,"));
  EXPECT_THAT(err({"--steps", "12x"}), HasSubstr("got '12x'"));
  EXPECT_THAT(err({"--steps", "99999999999"}), HasSubstr("--steps"));
  EXPECT_THAT(err({"--group", "1"}), HasSubstr("--group must be an integer in [2,"));
  EXPECT_THAT(err({"--digits", "5"}), HasSubstr("[1, 4]"));
  EXPECT_THAT(err({"--sft-steps", "-1"}), HasSubstr("--sft-steps"));
  EXPECT_THAT(err({"--lr", "0"}), HasSubstr("--lr must be a finite number > 0, got '0'"));
  EXPECT_THAT(err({"--lr", "nan"}), HasSubstr("--lr"));
  EXPECT_THAT(err({"--temperature", "-1"}), HasSubstr("--temperature"));
  EXPECT_THAT(err({"--kl-coef", "-0.1"}), HasSubstr("--kl-coef must be a finite number >= 0"));
  EXPECT_THAT(err({"--kl-coef", "inf"}), HasSubstr("got 'inf'"));
  EXPECT_THAT(err({"--seed", "-3"}), HasSubstr("--seed must be a non-negative integer"));
  EXPECT_THAT(err({"--metrics", ""}), HasSubstr("--metrics needs a non-empty path"));
  EXPECT_THAT(err({"--epochs", "0"}), HasSubstr("--epochs must be an integer in [1, 100]"));
  EXPECT_THAT(err({"--sft-target", "1.5"}), HasSubstr("--sft-target must be in [0, 1]"));
  EXPECT_THAT(err({"--sft-target", "-0.5"}), HasSubstr("--sft-target"));
}

TEST(GrpoOptions, HelpAndUsage) {
  EXPECT_TRUE(parse_options({"--help"}).help);
  auto u = usage("grpo");
  for (auto flag : {"--steps", "--seed", "--metrics", "--plot", "--quiet", "--quick"})
    EXPECT_THAT(u, HasSubstr(flag));
}
