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
  EXPECT_THAT(err({"--bogus"}), HasSubstr("not expected: --bogus"));
  EXPECT_THAT(err({"--steps"}), HasSubstr("--steps: 1 required N missing"));
  EXPECT_THAT(err({"--steps", "3", "extra"}), HasSubstr("not expected: extra"));
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

TEST(GrpoOptions, ModesAndPlacement) {
  auto d = parse_options({});
  ASSERT_TRUE(d.error.empty()) << d.error;
  EXPECT_EQ(d.opts.mode, "sync");
  EXPECT_EQ(d.opts.placement, "colocated");
  EXPECT_EQ(d.opts.tis, "none"); // nothing to correct in sync mode
  auto r = parse_options({"--mode", "fully_async", "--placement", "split", "--max-staleness", "2",
                          "--pause", "abort", "--eval-every", "5"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.opts.mode, "fully_async");
  EXPECT_EQ(r.opts.placement, "split");
  EXPECT_EQ(r.opts.max_staleness, 2);
  EXPECT_EQ(r.opts.pause, "abort");
  EXPECT_EQ(r.opts.eval_every, 5);
  EXPECT_EQ(r.opts.tis, "token"); // asynchronous modes correct by default
  auto n = parse_options({"--mode", "one_step_off", "--placement", "split", "--tis", "none"});
  ASSERT_TRUE(n.error.empty()) << n.error;
  EXPECT_EQ(n.opts.tis, "none");
  auto err = [](std::vector<std::string> args) { return parse_options(args).error; };
  EXPECT_THAT(err({"--mode", "async"}),
              HasSubstr("--mode must be one of sync, one_step_off, fully_async; got 'async'"));
  EXPECT_THAT(err({"--placement", "spread"}), HasSubstr("--placement must be one of colocated"));
  EXPECT_THAT(err({"--pause", "drain"}), HasSubstr("--pause must be one of keep, abort"));
  EXPECT_THAT(err({"--tis", "yes"}), HasSubstr("--tis must be one of none, token, sequence"));
  EXPECT_THAT(err({"--max-staleness", "-1"}), HasSubstr("--max-staleness must be an integer"));
  EXPECT_THAT(err({"--mode", "fully_async"}), HasSubstr("needs --placement split"));
  EXPECT_THAT(err({"--resume"}), HasSubstr("--resume needs --checkpoint-dir DIR"));
  EXPECT_THAT(err({"--checkpoint-every", "2"}),
              HasSubstr("--checkpoint-every needs --checkpoint-dir DIR"));
  // Checkpoints work with --env too.
  auto env_ckpt = parse_options({"--env", "x", "--model", "m", "--checkpoint-dir", "d",
                                 "--checkpoint-every", "2", "--resume"});
  ASSERT_TRUE(env_ckpt.error.empty()) << env_ckpt.error;
  EXPECT_EQ(env_ckpt.opts.checkpoint_every, 2);
  EXPECT_THAT(err({"--env", "x", "--model", "m", "--resume"}),
              HasSubstr("--resume needs --checkpoint-dir DIR"));
  auto c = parse_options({"--checkpoint-dir", "d", "--checkpoint-every", "3", "--resume"});
  ASSERT_TRUE(c.error.empty()) << c.error;
  EXPECT_EQ(c.opts.checkpoint_dir, "d");
  EXPECT_EQ(c.opts.checkpoint_every, 3);
  EXPECT_TRUE(c.opts.resume);
  EXPECT_TRUE(parse_options({}).opts.accuracy_goal);
  EXPECT_FALSE(parse_options({"--no-goal"}).opts.accuracy_goal);
  EXPECT_THAT(err({"--no-goal", "--env", "x", "--model", "m"}),
              HasSubstr("--no-goal belongs to the built-in tasks (--task)"));
  EXPECT_THAT(err({"--eval-every", "5", "--env", "x", "--model", "m"}),
              HasSubstr("--eval-every belongs to the built-in tasks (--task)"));
  // --env runs in every mode; the asynchronous ones need split placement as for the tasks.
  auto env_async = parse_options({"--mode", "fully_async", "--placement", "split",
                                  "--max-staleness", "2", "--env", "x", "--model", "m"});
  ASSERT_TRUE(env_async.error.empty()) << env_async.error;
  EXPECT_EQ(env_async.opts.mode, "fully_async");
  EXPECT_EQ(env_async.opts.max_staleness, 2);
  EXPECT_EQ(env_async.opts.tis, "token");
  EXPECT_THAT(err({"--mode", "one_step_off", "--env", "x", "--model", "m"}),
              HasSubstr("--mode one_step_off needs --placement split"));
  // Recovering lost engines: split placement, the arithmetic task.
  EXPECT_EQ(parse_options({}).opts.max_restarts, 0);
  auto h = parse_options({"--placement", "split", "--max-restarts", "2", "--recovery-timeout",
                          "5"});
  ASSERT_TRUE(h.error.empty()) << h.error;
  EXPECT_EQ(h.opts.max_restarts, 2);
  EXPECT_EQ(h.opts.recovery_timeout, 5.0);
  EXPECT_THAT(err({"--max-restarts", "1"}), HasSubstr("--max-restarts needs --placement split"));
  EXPECT_THAT(err({"--placement", "split", "--max-restarts", "-1"}),
              HasSubstr("--max-restarts must be an integer in [0, 1000]"));
  EXPECT_THAT(err({"--placement", "split", "--recovery-timeout", "0"}),
              HasSubstr("--recovery-timeout must be a finite number > 0"));
  // With --env too (its lost engines are replaced), and still only with split placement.
  auto env = parse_options({"--placement", "split", "--max-restarts", "1", "--env", "x",
                            "--model", "m"});
  ASSERT_TRUE(env.error.empty()) << env.error;
  EXPECT_EQ(env.opts.max_restarts, 1);
  EXPECT_THAT(err({"--max-restarts", "1", "--env", "x", "--model", "m"}),
              HasSubstr("--max-restarts needs --placement split"));
}

TEST(GrpoOptions, HelpAndUsage) {
  EXPECT_TRUE(parse_options({"--help"}).help);
  EXPECT_EQ(parse_options({"--log-level", "debug"}).opts.log_level, "debug");
  auto u = usage("grpo");
  EXPECT_EQ(u.rfind("usage: grpo [OPTIONS]\n", 0), 0u) << u;
  EXPECT_THAT(u, HasSubstr("example:\n  grpo --quick"));
  // Every flag with its meaning and, for valued ones, the default.
  for (auto flag : {"--steps", "--seed", "--metrics", "--plot", "--quiet", "--quick",
                    "--log-level", "--env", "--model", "--max-restarts", "--tis"})
    EXPECT_THAT(u, HasSubstr(flag));
  EXPECT_THAT(u, HasSubstr("--steps N=150"));
  EXPECT_THAT(u, HasSubstr("GRPO steps"));
  EXPECT_THAT(u, HasSubstr("--placement P=colocated"));
  // The defaults of the mode the other flags select.
  EXPECT_THAT(usage("grpo", {"--quick"}), HasSubstr("--steps N=4"));
  EXPECT_THAT(usage("grpo", {"--env", "x"}), HasSubstr("--steps N=20"));
  // Help wins over everything else on the line, bad values included.
  EXPECT_TRUE(parse_options({"--steps", "0", "--help"}).help);
}

TEST(GrpoOptions, EnvModeTakesItsOwnDefaultsAndFlags) {
  auto r = parse_options({"--env", "python3 'my envs/guess.py' --level\\ 2", "--model", "m",
                          "--env-task", R"({"max_turns": 3})", "--max-turns", "4", "--turn-tokens",
                          "12", "--env-timeout", "2.5", "--min-final-reward", "0.5"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  const auto& o = r.opts;
  EXPECT_EQ(o.env_argv, (std::vector<std::string>{"python3", "my envs/guess.py", "--level 2"}));
  EXPECT_EQ(o.model, "m");
  EXPECT_EQ(o.env_task, R"({"max_turns": 3})");
  EXPECT_EQ(o.max_turns, 4);
  EXPECT_EQ(o.turn_tokens, 12);
  EXPECT_DOUBLE_EQ(o.env_timeout, 2.5);
  EXPECT_DOUBLE_EQ(o.min_final_reward, 0.5);
  EXPECT_LT(options{}.min_final_reward, 0) << "no goal unless asked";
  EXPECT_LT(o.steps, options{}.steps);
  EXPECT_LE(o.prompts * o.group, max_environments);
  auto q = parse_options({"--quick", "--env", "e", "--model", "m"});
  ASSERT_TRUE(q.error.empty()) << q.error;
  EXPECT_TRUE(q.opts.quick);
  EXPECT_LT(q.opts.steps, o.steps);
  EXPECT_LT(q.opts.prompts * q.opts.group, o.prompts * o.group);
  EXPECT_LT(q.opts.turn_tokens, options{}.turn_tokens);
}

TEST(GrpoOptions, RefusesFlagsOfTheOtherMode) {
  auto err = [](std::vector<std::string> args) { return parse_options(args).error; };
  EXPECT_THAT(err({"--model", "m"}), HasSubstr("--model applies only with --env CMD"));
  EXPECT_THAT(err({"--max-turns", "3"}), HasSubstr("--max-turns applies only with --env"));
  EXPECT_THAT(err({"--min-final-reward", "1"}), HasSubstr("applies only with --env"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--digits", "3"}),
              HasSubstr("--digits belongs to the built-in tasks (--task)"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--sft-steps", "3"}),
              HasSubstr("--sft-steps belongs to the built-in tasks (--task)"));
  EXPECT_THAT(err({"--env", "e"}), HasSubstr("--env needs --model DIR"));
  EXPECT_THAT(err({"--env", "", "--model", "m"}), HasSubstr("--env needs a command"));
  EXPECT_THAT(err({"--env", "  ", "--model", "m"}), HasSubstr("--env: the command is empty"));
  EXPECT_THAT(err({"--env", "python3 'x", "--model", "m"}),
              HasSubstr("unterminated ' quote"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--env-task", "[1]"}),
              HasSubstr("--env-task must be a JSON object, got '[1]'"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--task", "sort"}),
              HasSubstr("--task belongs to the built-in tasks (--task)"));
  EXPECT_THAT(err({"--env-task", "{}"}), HasSubstr("--env-task applies only with --env"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--prompts", "100", "--group", "3"}),
              HasSubstr("--prompts x --group = 300 environments at once; at most 256"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--turn-tokens", "0"}),
              HasSubstr("--turn-tokens must be an integer in [1,"));
  EXPECT_THAT(err({"--env", "e", "--model", "m", "--env-timeout", "0"}),
              HasSubstr("--env-timeout must be a finite number > 0"));
}

TEST(GrpoOptions, TheSortTaskTakesItsOwnDefaultsAndFlags) {
  auto r = parse_options({"--task", "sort", "--min-numbers", "4", "--max-numbers", "12"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  const auto& o = r.opts;
  EXPECT_EQ(o.task, "sort");
  EXPECT_EQ(o.min_numbers, 4);
  EXPECT_EQ(o.max_numbers, 12);
  EXPECT_EQ(options{}.task, "arith");
  // Long answers: fewer prompts per step than the arithmetic task.
  EXPECT_LT(o.prompts, options{}.prompts);
  EXPECT_THAT(usage("grpo", {"--task", "sort"}), HasSubstr("--prompts P=16"));
  // No KL term by default (the arithmetic task keeps one); --kl-coef still sets it.
  EXPECT_DOUBLE_EQ(o.kl_coef, 0.0);
  EXPECT_GT(options{}.kl_coef, 0.0);
  EXPECT_DOUBLE_EQ(parse_options({"--task", "sort", "--kl-coef", "0.01"}).opts.kl_coef, 0.01);
  // Padding-free passes by default: a heavy tail of lengths.
  EXPECT_EQ(o.micro_batch_tokens, 4096);
  EXPECT_EQ(options{}.micro_batch_tokens, 0);
  EXPECT_EQ(parse_options({"--micro-batch-tokens", "512"}).opts.micro_batch_tokens, 512);
  EXPECT_THAT(usage("grpo", {"--task", "sort"}), HasSubstr("--task T=sort"));
  auto q = parse_options({"--quick", "--task", "sort"});
  ASSERT_TRUE(q.error.empty()) << q.error;
  EXPECT_TRUE(q.opts.quick);
  EXPECT_EQ(q.opts.task, "sort");
  EXPECT_EQ(q.opts.steps, 4);
  // The last --task counts, with its defaults.
  EXPECT_EQ(parse_options({"--task", "sort", "--task", "arith"}).opts.prompts, options{}.prompts);
  auto err = [](std::vector<std::string> args) { return parse_options(args).error; };
  EXPECT_THAT(err({"--micro-batch-tokens", "-1"}),
              HasSubstr("--micro-batch-tokens must be an integer in [0,"));
  EXPECT_THAT(err({"--task", "chess"}),
              HasSubstr("--task must be one of arith, sort, count; got 'chess'"));
  EXPECT_THAT(err({"--task", ""}), HasSubstr("--task needs a task name (arith, sort or count)"));
  EXPECT_THAT(err({"--digits", "3", "--task", "sort"}),
              HasSubstr("--digits belongs to --task arith, not to --task sort"));
  EXPECT_THAT(err({"--max-numbers", "30"}),
              HasSubstr("--max-numbers belongs to --task count or sort, not to --task arith"));
  EXPECT_THAT(err({"--task", "sort", "--min-numbers", "1"}),
              HasSubstr("--min-numbers must be an integer in [2, 100], got '1'"));
  EXPECT_THAT(err({"--task", "sort", "--min-numbers", "20", "--max-numbers", "10"}),
              HasSubstr("--max-numbers must be >= --min-numbers (20), got 10"));
}

TEST(GrpoOptions, TheCountTaskTakesTheSortTasksDefaultsWithLongerAnswers) {
  auto r = parse_options({"--task", "count"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  const auto sort = parse_options({"--task", "sort"}).opts;
  const auto& o = r.opts;
  EXPECT_EQ(o.task, "count");
  EXPECT_EQ(o.max_numbers, 100);
  EXPECT_EQ(sort.max_numbers, 80);
  EXPECT_EQ(o.min_numbers, sort.min_numbers);
  EXPECT_EQ(o.prompts, sort.prompts);
  EXPECT_EQ(o.micro_batch_tokens, sort.micro_batch_tokens);
  EXPECT_DOUBLE_EQ(o.kl_coef, 0.0);
  EXPECT_DOUBLE_EQ(o.lr, 5e-4);
  EXPECT_DOUBLE_EQ(parse_options({"--task", "count", "--lr", "1e-3"}).opts.lr, 1e-3);
  EXPECT_THAT(usage("grpo", {"--task", "count"}), HasSubstr("--max-numbers N=100"));
  auto flags = parse_options({"--task", "count", "--min-numbers", "20", "--max-numbers", "40"});
  ASSERT_TRUE(flags.error.empty()) << flags.error;
  EXPECT_EQ(flags.opts.min_numbers, 20);
  EXPECT_EQ(flags.opts.max_numbers, 40);
  auto err = [](std::vector<std::string> args) { return parse_options(args).error; };
  EXPECT_THAT(err({"--task", "count", "--digits", "3"}),
              HasSubstr("--digits belongs to --task arith, not to --task count"));
  EXPECT_THAT(err({"--task", "count", "--max-numbers", "101"}),
              HasSubstr("--max-numbers must be an integer in [2, 100], got '101'"));
  auto q = parse_options({"--quick", "--task", "count"});
  ASSERT_TRUE(q.error.empty()) << q.error;
  EXPECT_EQ(q.opts.steps, 4);
  EXPECT_EQ(q.opts.task, "count");
}

TEST(GrpoOptions, SplitsCommandsLikeASimpleShell) {
  std::vector<std::string> words;
  std::string error;
  ASSERT_TRUE(split_command("  a \"b c\"d 'e\\f' g\\ h  ", words, error)) << error;
  EXPECT_EQ(words, (std::vector<std::string>{"a", "b cd", "e\\f", "g h"}));
  ASSERT_TRUE(split_command("x '' y", words, error)) << error;
  EXPECT_EQ(words, (std::vector<std::string>{"x", "", "y"}));
  EXPECT_FALSE(split_command("a\\", words, error));
  EXPECT_THAT(error, HasSubstr("ends with a backslash"));
  EXPECT_FALSE(split_command("\"a", words, error));
  EXPECT_THAT(error, HasSubstr("unterminated \" quote"));
}

TEST(GrpoOptions, WeightSyncAndLogFlags) {
  auto o = parse_options({"--weight-transport", "gloo", "--delta-sync", "--log-format", "json"});
  ASSERT_TRUE(o.error.empty()) << o.error;
  EXPECT_EQ(o.opts.weight_transport, "gloo");
  EXPECT_TRUE(o.opts.delta_sync);
  EXPECT_EQ(o.opts.log_format, "json");
  EXPECT_EQ(parse_options({}).opts.weight_transport, "auto");
  EXPECT_FALSE(parse_options({}).opts.delta_sync);
  EXPECT_THAT(parse_options({"--weight-transport", "pigeon"}).error,
              HasSubstr("--weight-transport must be one of auto, in_process, shm, gloo"));
  EXPECT_THAT(parse_options({"--delta-sync", "--weight-transport", "shm"}).error,
              HasSubstr("--delta-sync goes through Gloo; --weight-transport shm moves whole"));
  EXPECT_THAT(parse_options({"--log-format", "yaml"}).error,
              HasSubstr("--log-format must be one of text, json; got 'yaml'"));
}

TEST(GrpoOptions, NumericsFlags) {
  auto o = parse_options({"--compute-dtype", "bf16", "--batch-invariant"});
  ASSERT_TRUE(o.error.empty()) << o.error;
  EXPECT_EQ(o.opts.compute_dtype, "bf16");
  EXPECT_TRUE(o.opts.batch_invariant);
  EXPECT_EQ(parse_options({"--compute-dtype", "fp32"}).opts.compute_dtype, "fp32");
  // Unset: each rank's node default.
  EXPECT_EQ(parse_options({}).opts.compute_dtype, "");
  EXPECT_FALSE(parse_options({}).opts.batch_invariant);
  EXPECT_THAT(parse_options({"--compute-dtype", "fp16"}).error,
              HasSubstr("--compute-dtype must be one of fp32, bf16; got 'fp16'"));
}

TEST(GrpoOptions, AFlagGivenTwiceTakesItsLastValue) {
  // scripts/cluster-demo passes its defaults first, then the user's flags.
  auto o = parse_options({"--steps", "30", "--mode", "sync", "--steps", "12"});
  ASSERT_TRUE(o.error.empty()) << o.error;
  EXPECT_EQ(o.opts.steps, 12);
  // The last value is checked like any other.
  EXPECT_THAT(parse_options({"--steps", "30", "--steps", "0"}).error,
              HasSubstr("--steps must be an integer in [1,"));
}

TEST(GrpoOptions, FullyAsyncWithAStalenessBoundOfZeroIsRefusedNamingTheModesThatFit) {
  auto o = parse_options({"--mode", "fully_async", "--placement", "split", "--max-staleness",
                          "0"});
  EXPECT_THAT(o.error, HasSubstr("--mode fully_async with --max-staleness 0"));
  EXPECT_THAT(o.error, HasSubstr("use --mode one_step_off"));
  EXPECT_THAT(o.error, HasSubstr("--mode sync"));
  // A bound of 1 or more is fine, and so is 0 in the other modes.
  EXPECT_TRUE(parse_options({"--mode", "fully_async", "--placement", "split", "--max-staleness",
                             "1"})
                  .error.empty());
  EXPECT_TRUE(parse_options({"--mode", "one_step_off", "--placement", "split",
                             "--max-staleness", "0"})
                  .error.empty());
}
