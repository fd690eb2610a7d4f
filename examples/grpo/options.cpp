#include "examples/grpo/options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "examples/common/command_line.hpp"

#include "runtime/logging.hpp"
#include "strings/format.hpp"

namespace rlforge::examples::grpo {

namespace {

void apply_quick(options& o) {
  o.quick = true;
  o.steps = 4;
  o.held_out = 50;
  o.sft_steps = 40;
  o.sft_batch = 32;
  o.sft_target = 0;
  o.prompts = 8;
  o.group = 4;
}

// The sorting task: answers of 24-160 tokens (generation is a large share of a step), so fewer
// prompts per step than the arithmetic task; a longer warm start to a lower target (exact
// answers to long lists are rare at first), and a goal of +10 points. No KL term, as in DAPO
// and other long-response recipes: its reference forward would be a sixth of a step.
void apply_sort_defaults(options& o) {
  o.task = "sort";
  o.kl_coef = 0;
  o.steps = 60;
  o.prompts = 16;
  o.group = 8;
  o.epochs = 1;
  o.micro_batch_tokens = 4096; // a heavy tail of lengths: padding to the longest would triple the work
  o.sft_steps = 3000;
  o.sft_target = 0.3;
  o.sft_batch = 32;
  o.held_out = 100;
}

// The counting task: the sorting task's settings (long answers, a heavy tail of lengths, no KL
// term), with answers of up to 100 numbers (200 tokens) after a 7-token prompt, and half the
// learning rate (at 1e-3 the held-out accuracy swung by up to 15 points between evaluations).
void apply_count_defaults(options& o) {
  apply_sort_defaults(o);
  o.task = "count";
  o.max_numbers = 100;
  o.lr = 5e-4;
}

// The environment run: fewer, longer episodes (each step talks to prompts x group processes).
void apply_env_defaults(options& o) {
  o.steps = 20;
  o.prompts = 8;
  o.group = 4;
}

void apply_env_quick(options& o) {
  o.quick = true;
  o.steps = 3;
  o.prompts = 2;
  o.group = 4;
  o.max_turns = 3;
  o.turn_tokens = 8;
}

// Flags that belong to the built-in tasks, to one of them, or to --env only.
const std::set<std::string> task_flags{
    "--task",       "--digits",         "--min-numbers",      "--max-numbers", "--held-out",
    "--sft-steps",  "--sft-batch",      "--sft-lr",           "--sft-target",  "--no-goal",
    "--eval-every"};
const std::map<std::string, std::set<std::string>> flag_tasks{{"--digits", {"arith"}},
                                                              {"--min-numbers", {"sort", "count"}},
                                                              {"--max-numbers", {"sort", "count"}}};
const std::set<std::string> env_flags{"--model",       "--env-task",    "--max-turns",
                                      "--turn-tokens", "--env-timeout", "--min-final-reward"};

} // namespace

bool split_command(const std::string& command, std::vector<std::string>& words,
                   std::string& error) {
  words.clear();
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if (quote != 0) {
      if (c == quote)
        quote = 0;
      else
        word += c;
    } else if (c == '\\') {
      if (i + 1 == command.size()) {
        error = "the command ends with a backslash";
        return false;
      }
      word += command[++i];
      in_word = true;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word)
        words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote != 0) {
    error = std::string("the command has an unterminated ") + quote + " quote";
    return false;
  }
  if (in_word)
    words.push_back(word);
  if (words.empty()) {
    error = "the command is empty";
    return false;
  }
  return true;
}

namespace {

/// One flag of the job, declared once: the parser and the help both read this list. `value` is
/// the value's name in the help ("" for a switch).
struct flag_doc {
  const char* name;
  const char* value;
  const char* help;
};

const std::vector<flag_doc>& flag_docs() {
  // One flag per entry, its help aligned after its name.
  // clang-format off
  static const std::vector<flag_doc> docs{
      {"--steps", "N", "GRPO steps"},
      {"--seed", "S", "seed of the model, the task split and sampling (>= 0)"},
      {"--metrics", "FILE", "JSONL metrics, one record per step"},
      {"--plot", "FILE", "reward curve (PNG, with gnuplot)"},
      {"--quiet", "", "no progress bar"},
      {"--quick", "", "a small run (a few steps), end to end; sets the defaults below"},
      {"--task", "T", "the built-in task: arith (multi-digit addition, 2-4 token answers), sort "
                      "(sorting lists of distinct numbers, 24-160 token answers) or count "
                      "(counting from a number to another in steps, 7-token prompts, 24-200 "
                      "token answers)"},
      {"--digits", "D", "digits of each operand (1..4; arith)"},
      {"--min-numbers", "N", "shortest list to sort, fewest numbers to count (2..100; sort, "
                             "count)"},
      {"--max-numbers", "N", "longest list to sort, most numbers to count (--min-numbers..100; "
                             "sort, count)"},
      {"--held-out", "N", "held-out problems for the accuracy"},
      {"--no-goal", "", "report the accuracy gain without failing under the task's goal (+20 "
                        "points for arith, +10 for sort and count)"},
      {"--sft-steps", "N", "most warm-start (supervised) steps (0 = none)"},
      {"--sft-batch", "B", "warm-start batch"},
      {"--sft-lr", "X", "warm-start learning rate (> 0)"},
      {"--sft-target", "A", "stop the warm start at this greedy accuracy (0..1; 0 = all steps)"},
      {"--prompts", "P", "prompts per step"},
      {"--group", "G", "samples per prompt (>= 2)"},
      {"--lr", "X", "policy learning rate, cosine-decayed to lr/10 (> 0)"},
      {"--epochs", "E", "PPO-clip updates on each step's samples (1..100)"},
      {"--micro-batch-tokens", "N", "padding-free micro-batches of at most N tokens in the "
                                    "policy and ref passes (0 = one pass padded to the longest "
                                    "row)"},
      {"--temperature", "T", "sampling temperature (> 0)"},
      {"--kl-coef", "C", "KL-to-reference loss coefficient (>= 0; 0 = off)"},
      {"--placement", "P", "colocated (roles share the devices) or split (two groups)"},
      {"--mode", "M", "sync, one_step_off or fully_async (async modes need --placement split)"},
      {"--max-staleness", "K", "versions a trained rollout may lag (0..1000)"},
      {"--pause", "P", "what weight updates do to partial rollouts: keep or abort"},
      {"--weight-transport", "T", "weight sync transport: auto (the fastest that reaches each "
                                  "engine), in_process, shm or gloo"},
      {"--delta-sync", "", "syncs through Gloo send only the weights' changed elements when "
                           "that is smaller (needs --weight-transport auto or gloo)"},
      {"--compute-dtype", "D", "precision of the matrix products: fp32 or bf16 (default: "
                               "each node's, bf16 where the CPU has fast bf16 GEMMs)"},
      {"--batch-invariant", "", "batch-invariant numerics: a token's log-prob does not depend on "
                                "its batch-mates (replayed steps repeat their bits)"},
      {"--tis", "T", "off-policy correction: none, token or sequence (default: none in sync "
                     "mode, token otherwise)"},
      {"--eval-every", "N", "held-out accuracy every N steps (0 = at the ends only)"},
      {"--checkpoint-dir", "DIR", "where checkpoints go"},
      {"--checkpoint-every", "N", "a checkpoint every N steps (0 = never; needs --checkpoint-dir)"},
      {"--resume", "", "go on from the latest checkpoint in --checkpoint-dir"},
      {"--max-restarts", "N", "node losses to recover from (needs --placement split; a lost "
                              "trainer also needs --checkpoint-every, and with --env only "
                              "lost engines are recovered)"},
      {"--recovery-timeout", "S", "seconds a recovery waits for room (> 0)"},
      {"--cluster", "HOST:PORT", "run the ranks on a cluster's nodes (rlforge head / node)"},
      {"--tls", "DIR", "the cluster's TLS directory"},
      {"--log-level", "L", "trace, debug, info, warn, error, critical or off"},
      {"--log-format", "F", "log lines: text, or json (one object per line)"},
      {"--env", "CMD", "GRPO on an environment program's episodes (docs/ENVIRONMENTS.md)"},
      {"--model", "DIR", "model directory with a tokenizer and a chat template (--env)"},
      {"--env-task", "JSON", "JSON object sent with every reset (--env)"},
      {"--max-turns", "N", "turns before the driver stops an episode (--env)"},
      {"--turn-tokens", "N", "most tokens sampled per turn (--env)"},
      {"--env-timeout", "S", "seconds an environment may take per call (--env)"},
      {"--min-final-reward", "R", "fail unless the last five steps' mean reward reaches R (--env)"},
      // clang-format on
  };
  return docs;
}

/// What the job does, for --help (after the usage line, before the flags).
const char* about =
    "GRPO on multi-digit addition: SFT warm start, then GRPO with colocated policy, ref and\n"
    "inference engines on virtual GPUs; prints held-out accuracy before and after. A full\n"
    "run fails unless it gains 20 points (--no-goal: report the gain without judging it).\n"
    "--task sort: the same on sorting lists of 12-80 distinct numbers in 0..99, whose answers\n"
    "are long (24-160 tokens, a heavy tail of lengths), with partial credit; goal +10 points.\n"
    "--task count: counting 12-100 numbers from a start to an end in steps of 1-3 (a 7-token\n"
    "prompt, 24-200 token answers, the same partial credit and goal).\n"
    "With --env CMD: GRPO on the multi-turn episodes of an environment program speaking\n"
    "rlforge's JSON-lines protocol (docs/ENVIRONMENTS.md), with the tokenizer and chat template\n"
    "of the model in --model DIR (rlforge init-model writes them); defaults --steps 20\n"
    "--prompts 8 --group 4. A failing environment fails its episode, not the job.\n"
    "--placement split puts the policy and ref in one placement group and the engines in\n"
    "another; --mode one_step_off generates the next batch while this one trains, fully_async\n"
    "keeps the engines generating --max-staleness batches ahead (with --env: GRPO groups of\n"
    "episodes, so the engines sample while environments think). --max-restarts N recovers\n"
    "from up to N node losses: lost engines are placed again, get the policy's weights, and\n"
    "the rollouts they held are generated again; a lost trainer is placed again, restored from\n"
    "the last checkpoint, and the steps after it are replayed. With --env the lost engines are\n"
    "replaced while the episodes in flight wait, each resuming at the turn that failed; a lost\n"
    "trainer ends an --env run.\n"
    "Defaults below are those of the mode the other flags select (--task, --quick, --env).\n"
    "`grpo_example --compare BASELINE.jsonl RUN.jsonl...` compares the metrics of runs.";

using strings::number_text;

/// Where each valued flag's value goes in `o`, and what it accepts.
struct flag_targets {
  /// Integer flags: target, smallest and largest allowed value.
  struct int_flag {
    int* target;
    long long lo, hi;
  };
  std::map<std::string, int_flag> ints;
  /// Real flags: target and whether 0 is allowed (all must be finite and not negative).
  std::map<std::string, std::pair<double*, bool>> reals;
  std::map<std::string, std::string*> texts;

  explicit flag_targets(options& o) {
    constexpr long long big = 1000000000;
    ints = {
        {"--steps", {&o.steps, 1, big}},         {"--digits", {&o.digits, 1, 4}},
        {"--held-out", {&o.held_out, 1, big}},   {"--sft-steps", {&o.sft_steps, 0, big}},
        {"--sft-batch", {&o.sft_batch, 1, big}}, {"--prompts", {&o.prompts, 1, big}},
        {"--group", {&o.group, 2, big}},         {"--epochs", {&o.epochs, 1, 100}},
        {"--max-turns", {&o.max_turns, 1, 1000}}, {"--turn-tokens", {&o.turn_tokens, 1, 100000}},
        {"--max-staleness", {&o.max_staleness, 0, 1000}},
        {"--eval-every", {&o.eval_every, 0, big}},
        {"--checkpoint-every", {&o.checkpoint_every, 0, big}},
        {"--max-restarts", {&o.max_restarts, 0, 1000}},
        {"--micro-batch-tokens", {&o.micro_batch_tokens, 0, big}},
        {"--min-numbers", {&o.min_numbers, 2, 100}},
        {"--max-numbers", {&o.max_numbers, 2, 100}},
    };
    reals = {
        {"--sft-lr", {&o.sft_lr, false}},
        {"--lr", {&o.lr, false}},
        {"--temperature", {&o.temperature, false}},
        {"--kl-coef", {&o.kl_coef, true}},
        {"--sft-target", {&o.sft_target, true}},
        {"--env-timeout", {&o.env_timeout, false}},
        {"--min-final-reward", {&o.min_final_reward, true}},
        {"--recovery-timeout", {&o.recovery_timeout, false}},
    };
    texts = {{"--metrics", &o.metrics},   {"--plot", &o.plot},
             {"--cluster", &o.cluster},   {"--tls", &o.tls},
             {"--placement", &o.placement}, {"--mode", &o.mode},
             {"--pause", &o.pause},       {"--tis", &o.tis},
             {"--env", &o.env_command},   {"--checkpoint-dir", &o.checkpoint_dir},
             {"--model", &o.model},       {"--env-task", &o.env_task},
             {"--task", &o.task},
             {"--log-level", &o.log_level}, {"--log-format", &o.log_format},
             {"--weight-transport", &o.weight_transport},
             {"--compute-dtype", &o.compute_dtype}};
  }

  /// The value `name` holds now, as --help shows it ("" for none).
  std::string text_of(const std::string& name, const options& o) const {
    if (name == "--seed")
      return std::to_string(o.seed);
    if (auto i = ints.find(name); i != ints.end())
      return std::to_string(*i->second.target);
    if (auto r = reals.find(name); r != reals.end())
      return name == "--min-final-reward" && *r->second.first < 0 ? ""
                                                                   : number_text(*r->second.first);
    if (auto t = texts.find(name); t != texts.end())
      return *t->second;
    return "";
  }
};

/// The options with the defaults of the mode `args` select (--env, --task sort or count, --quick),
/// before any flag. The last --task given counts, as with every flag.
options mode_defaults(const std::vector<std::string>& args, bool& env_mode) {
  options o;
  env_mode = std::find(args.begin(), args.end(), "--env") != args.end();
  const bool quick = std::find(args.begin(), args.end(), "--quick") != args.end();
  std::string task;
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--task")
      task = args[i + 1];
  if (env_mode)
    apply_env_defaults(o);
  else if (task == "sort")
    apply_sort_defaults(o);
  else if (task == "count")
    apply_count_defaults(o);
  if (quick)
    env_mode ? apply_env_quick(o) : apply_quick(o);
  return o;
}

/// The command line's parser: each flag of `flag_docs` with its help and the default `o` holds.
/// Values are captured as text into `given` (flag, value; "" for a switch), in the order of
/// `flag_docs`, and checked by `parse_options`.
struct flag_parser {
  CLI::App app;
  std::vector<std::pair<std::string, std::string>> given;

  flag_parser(options& o, const std::string& prog) : app("", prog) {
    describe(app, about,
             "  " + prog + " --quick\n  " + prog +
                 " --mode fully_async --placement split --steps 100\n  " + prog +
                 " --env 'python3 examples/envs/guess_number.py' --model /tmp/base");
    const flag_targets targets(o);
    for (const auto& d : flag_docs()) {
      const std::string name = d.name;
      if (*d.value == '\0') {
        app.add_flag_callback(name, [this, name] { given.emplace_back(name, ""); }, d.help);
        continue;
      }
      auto* opt = app.add_option_function<std::string>(
          name, [this, name](const std::string& v) { given.emplace_back(name, v); }, d.help);
      opt->type_name(d.value);
      // A flag given twice takes its last value (scripts put defaults before the user's flags).
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      if (auto text = targets.text_of(name, o); !text.empty())
        opt->default_str(text);
    }
  }
};

} // namespace

parse_result parse_options(const std::vector<std::string>& args) {
  parse_result r;
  bool env_mode = false;
  r.opts = mode_defaults(args, env_mode);
  auto& o = r.opts;
  const flag_targets t(o);
  const auto& ints = t.ints;
  const auto& reals = t.reals;
  const auto& paths = t.texts;
  // Flags whose value is one of a few words.
  const std::map<std::string, std::vector<std::string>> choices{
      {"--task", {"arith", "sort", "count"}},
      {"--placement", {"colocated", "split"}},
      {"--mode", {"sync", "one_step_off", "fully_async"}},
      {"--pause", {"keep", "abort"}},
      {"--tis", {"none", "token", "sequence"}},
      {"--weight-transport", {"auto", "in_process", "shm", "gloo"}},
      {"--compute-dtype", {"fp32", "bf16"}},
      {"--log-format", {"text", "json"}}};
  flag_parser parser(o, "grpo_example");
  try {
    parser.app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
  } catch (const CLI::CallForHelp&) {
    r.help = true;
    return r;
  } catch (const CLI::ParseError& e) {
    r.error = e.what();
    return r;
  }
  std::set<std::string> given;
  for (const auto& [a, v] : parser.given) {
    if (a == "--quick")
      continue;
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    given.insert(a);
    if (a == "--resume") {
      o.resume = true;
      continue;
    }
    if (a == "--no-goal") {
      o.accuracy_goal = false;
      continue;
    }
    if (a == "--delta-sync") {
      o.delta_sync = true;
      continue;
    }
    if (a == "--batch-invariant") {
      o.batch_invariant = true;
      continue;
    }
    if (auto it = ints.find(a); it != ints.end()) {
      long long x = 0;
      if (!parse_integer(v, it->second.lo, it->second.hi, x)) {
        r.error = a + " must be an integer in [" + std::to_string(it->second.lo) + ", " +
                  std::to_string(it->second.hi) + "], got '" + v + "'";
        return r;
      }
      *it->second.target = static_cast<int>(x);
    } else if (auto rt = reals.find(a); rt != reals.end()) {
      double x = 0;
      bool zero_ok = rt->second.second;
      if (!parse_number(v, x) || x < 0 || (x == 0 && !zero_ok)) {
        r.error = a + " must be a finite number " + (zero_ok ? ">= 0" : "> 0") + ", got '" + v +
                  "'";
        return r;
      }
      if (a == "--sft-target" && x > 1) {
        r.error = "--sft-target must be in [0, 1], got '" + v + "'";
        return r;
      }
      *rt->second.first = x;
    } else if (auto pt = paths.find(a); pt != paths.end()) {
      if (v.empty()) {
        r.error = a + (a == "--env"        ? " needs a command"
                       : a == "--env-task" ? " needs a JSON object"
                       : a == "--task"     ? " needs a task name (arith, sort or count)"
                                           : " needs a non-empty path");
        return r;
      }
      if (auto c = choices.find(a); c != choices.end() &&
                                    std::find(c->second.begin(), c->second.end(), v) ==
                                        c->second.end()) {
        r.error = a + " must be one of";
        for (size_t k = 0; k < c->second.size(); ++k)
          r.error += (k ? ", " : " ") + c->second[k];
        r.error += "; got '" + v + "'";
        return r;
      }
      if (a == "--log-level") {
        if (auto why = runtime::check_log_level(v); !why.empty()) {
          r.error = "--" + why;
          return r;
        }
      }
      *pt->second = v;
    } else { // --seed
      long long x = 0;
      if (!parse_integer(v, 0, std::numeric_limits<long long>::max(), x)) {
        r.error = "--seed must be a non-negative integer, got '" + v + "'";
        return r;
      }
      o.seed = static_cast<uint64_t>(x);
    }
  }
  for (const auto& flag : given) {
    if (env_mode && task_flags.count(flag)) {
      r.error = flag + " belongs to the built-in tasks (--task) and does not apply with --env";
      return r;
    }
    if (auto t = flag_tasks.find(flag); t != flag_tasks.end() && !t->second.count(o.task)) {
      r.error = flag + " belongs to --task";
      for (auto k = t->second.begin(); k != t->second.end(); ++k)
        r.error += (k == t->second.begin() ? " " : " or ") + *k;
      r.error += ", not to --task " + o.task;
      return r;
    }
    if (!env_mode && env_flags.count(flag)) {
      r.error = flag + " applies only with --env CMD";
      return r;
    }
  }
  if (o.tis.empty())
    o.tis = o.mode == "sync" ? "none" : "token";
  if (o.delta_sync && o.weight_transport != "auto" && o.weight_transport != "gloo") {
    r.error = "--delta-sync goes through Gloo; --weight-transport " + o.weight_transport +
              " moves whole weights";
    return r;
  }
  if (o.max_numbers < o.min_numbers) {
    r.error = "--max-numbers must be >= --min-numbers (" + std::to_string(o.min_numbers) +
              "), got " + std::to_string(o.max_numbers);
    return r;
  }
  if ((o.checkpoint_every > 0 || o.resume) && o.checkpoint_dir.empty()) {
    r.error = std::string{o.resume ? "--resume" : "--checkpoint-every"} +
              " needs --checkpoint-dir DIR";
    return r;
  }
  if (o.mode != "sync" && o.placement != "split") {
    r.error = "--mode " + o.mode + " needs --placement split: colocated roles take turns on the "
              "device, so generation cannot overlap training";
    return r;
  }
  if (o.mode == "fully_async" && o.max_staleness == 0) {
    r.error = "--mode fully_async with --max-staleness 0 can train on nothing generated ahead "
              "(every rollout that saw a weight update is dropped); use --mode one_step_off "
              "(one batch ahead) or --mode sync";
    return r;
  }
  if (o.max_restarts > 0 && o.placement != "split") {
    r.error = "--max-restarts needs --placement split: the engines are replaced in a placement "
              "group of their own";
    return r;
  }
  if (!env_mode)
    return r;
  if (!split_command(o.env_command, o.env_argv, r.error)) {
    r.error = "--env: " + r.error + " ('" + o.env_command + "')";
    return r;
  }
  if (o.model.empty()) {
    r.error = "--env needs --model DIR (a model directory with a tokenizer and a chat template, "
              "e.g. written by rlforge init-model)";
    return r;
  }
  const auto env_task = nlohmann::json::parse(o.env_task, nullptr, /*allow_exceptions=*/false);
  if (!env_task.is_object()) {
    r.error = "--env-task must be a JSON object, got '" + o.env_task + "'";
    return r;
  }
  if (static_cast<long long>(o.prompts) * o.group > max_environments) {
    r.error = "--prompts x --group = " +
              std::to_string(static_cast<long long>(o.prompts) * o.group) +
              " environments at once; at most " + std::to_string(max_environments);
    return r;
  }
  return r;
}

std::string usage(const std::string& prog, const std::vector<std::string>& args) {
  bool env_mode = false;
  auto o = mode_defaults(args, env_mode);
  flag_parser parser(o, prog);
  return parser.app.help();
}

} // namespace rlforge::examples::grpo
