#include "examples/grpo/options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/logging.hpp"

namespace rlforge::examples::grpo {

namespace {

bool parse_int(const std::string& s, long long lo, long long hi, long long& out) {
  if (s.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  auto v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return false;
  out = v;
  return true;
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  auto v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v))
    return false;
  out = v;
  return true;
}

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

// Flags that belong to one mode only.
const std::set<std::string> arithmetic_flags{
    "--digits",     "--held-out",       "--sft-steps",      "--sft-batch", "--sft-lr",
    "--sft-target", "--checkpoint-dir", "--checkpoint-every", "--resume", "--no-goal",
    "--max-restarts", "--recovery-timeout"};
const std::set<std::string> env_flags{"--model",       "--task",        "--max-turns",
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

parse_result parse_options(const std::vector<std::string>& args) {
  parse_result r;
  auto& o = r.opts;
  const bool env_mode = std::find(args.begin(), args.end(), "--env") != args.end();
  const bool quick = std::find(args.begin(), args.end(), "--quick") != args.end();
  if (env_mode)
    apply_env_defaults(o);
  if (quick)
    env_mode ? apply_env_quick(o) : apply_quick(o);
  constexpr long long big = 1000000000;
  // Integer flags: target, smallest and largest allowed value.
  struct int_flag {
    int* target;
    long long lo, hi;
  };
  std::map<std::string, int_flag> ints{
    {"--steps", {&o.steps, 1, big}},         {"--digits", {&o.digits, 1, 4}},
    {"--held-out", {&o.held_out, 1, big}},   {"--sft-steps", {&o.sft_steps, 0, big}},
    {"--sft-batch", {&o.sft_batch, 1, big}}, {"--prompts", {&o.prompts, 1, big}},
    {"--group", {&o.group, 2, big}},         {"--epochs", {&o.epochs, 1, 100}},
    {"--max-turns", {&o.max_turns, 1, 1000}}, {"--turn-tokens", {&o.turn_tokens, 1, 100000}},
    {"--max-staleness", {&o.max_staleness, 0, 1000}}, {"--eval-every", {&o.eval_every, 0, big}},
    {"--checkpoint-every", {&o.checkpoint_every, 0, big}},
    {"--max-restarts", {&o.max_restarts, 0, 1000}},
  };
  // Real flags: target and whether 0 is allowed (all must be finite and not negative).
  std::map<std::string, std::pair<double*, bool>> reals{
    {"--sft-lr", {&o.sft_lr, false}},
    {"--lr", {&o.lr, false}},
    {"--temperature", {&o.temperature, false}},
    {"--kl-coef", {&o.kl_coef, true}},
    {"--sft-target", {&o.sft_target, true}},
    {"--env-timeout", {&o.env_timeout, false}},
    {"--min-final-reward", {&o.min_final_reward, true}},
    {"--recovery-timeout", {&o.recovery_timeout, false}},
  };
  std::map<std::string, std::string*> paths{{"--metrics", &o.metrics}, {"--plot", &o.plot},
                                            {"--cluster", &o.cluster}, {"--tls", &o.tls},
                                            {"--placement", &o.placement},
                                            {"--mode", &o.mode},       {"--pause", &o.pause},
                                            {"--tis", &o.tis},         {"--env", &o.env_command},
                                            {"--checkpoint-dir", &o.checkpoint_dir},
                                            {"--model", &o.model},     {"--task", &o.task},
                                            {"--log-level", &o.log_level}};
  // Flags whose value is one of a few words.
  const std::map<std::string, std::vector<std::string>> choices{
      {"--placement", {"colocated", "split"}},
      {"--mode", {"sync", "one_step_off", "fully_async"}},
      {"--pause", {"keep", "abort"}},
      {"--tis", {"none", "token", "sequence"}}};
  std::set<std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--quick")
      continue;
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (a == "--resume") {
      o.resume = true;
      given.insert(a);
      continue;
    }
    if (a == "--no-goal") {
      o.accuracy_goal = false;
      given.insert(a);
      continue;
    }
    if (a == "--help" || a == "-h") {
      r.help = true;
      continue;
    }
    bool known = ints.count(a) || reals.count(a) || paths.count(a) || a == "--seed";
    if (!known) {
      r.error = "unknown argument '" + a + "'";
      return r;
    }
    if (i + 1 >= args.size()) {
      r.error = a + " needs a value";
      return r;
    }
    given.insert(a);
    const auto& v = args[++i];
    if (auto it = ints.find(a); it != ints.end()) {
      long long x = 0;
      if (!parse_int(v, it->second.lo, it->second.hi, x)) {
        r.error = a + " must be an integer in [" + std::to_string(it->second.lo) + ", " +
                  std::to_string(it->second.hi) + "], got '" + v + "'";
        return r;
      }
      *it->second.target = static_cast<int>(x);
    } else if (auto rt = reals.find(a); rt != reals.end()) {
      double x = 0;
      bool zero_ok = rt->second.second;
      if (!parse_double(v, x) || x < 0 || (x == 0 && !zero_ok)) {
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
        r.error = a + (a == "--env"    ? " needs a command"
                       : a == "--task" ? " needs a JSON object"
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
      if (!parse_int(v, 0, std::numeric_limits<long long>::max(), x)) {
        r.error = "--seed must be a non-negative integer, got '" + v + "'";
        return r;
      }
      o.seed = static_cast<uint64_t>(x);
    }
  }
  for (const auto& flag : given) {
    if (env_mode && arithmetic_flags.count(flag)) {
      r.error = flag + " belongs to the arithmetic task and does not apply with --env";
      return r;
    }
    if (!env_mode && env_flags.count(flag)) {
      r.error = flag + " applies only with --env CMD";
      return r;
    }
  }
  if (o.tis.empty())
    o.tis = o.mode == "sync" ? "none" : "token";
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
  if (o.max_restarts > 0 && o.placement != "split") {
    r.error = "--max-restarts needs --placement split: the engines are replaced in a placement "
              "group of their own";
    return r;
  }
  if (env_mode && o.mode != "sync") {
    r.error = "--mode " + o.mode + " runs the arithmetic task; --env episodes are multi-turn "
              "and run in sync mode only";
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
  const auto task = nlohmann::json::parse(o.task, nullptr, /*allow_exceptions=*/false);
  if (!task.is_object()) {
    r.error = "--task must be a JSON object, got '" + o.task + "'";
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

std::string usage(const std::string& prog) {
  return "usage: " + prog +
         " [--steps N] [--seed S] [--metrics FILE] [--plot FILE] [--quiet] [--quick]\n"
         "       [--digits D] [--held-out N] [--no-goal] [--sft-steps N] [--sft-batch B]\n"
         "       [--sft-lr X] [--sft-target A] [--prompts P] [--group G] [--lr X] [--epochs E]\n"
         "       [--temperature T] [--kl-coef C] [--placement colocated|split]\n"
         "       [--mode sync|one_step_off|fully_async] [--max-staleness K]\n"
         "       [--pause keep|abort] [--tis none|token|sequence] [--eval-every N]\n"
         "       [--checkpoint-dir DIR [--checkpoint-every N] [--resume]]\n"
         "       [--max-restarts N [--recovery-timeout S]] [--cluster HOST:PORT] [--tls DIR]\n"
         "       [--log-level trace|debug|info|warn|error|critical|off]\n"
         "       [--env CMD --model DIR [--task JSON] [--max-turns N] [--turn-tokens N]\n"
         "        [--env-timeout S] [--min-final-reward R]]\n"
         "GRPO on multi-digit addition: SFT warm start, then GRPO with colocated policy, ref and\n"
         "inference engines on virtual GPUs; prints held-out accuracy before and after. A full\n"
         "run fails unless it gains 20 points (--no-goal: report the gain without judging it).\n"
         "With --env CMD: GRPO on the multi-turn episodes of an environment program speaking\n"
         "rlforge's JSON-lines protocol (docs/ENVIRONMENTS.md), e.g.\n"
         "  --env 'python3 examples/envs/guess_number.py' --model DIR\n"
         "with the tokenizer and chat template of the model in DIR (rlforge init-model writes\n"
         "them); defaults --steps 20 --prompts 8 --group 4. A failing environment fails its\n"
         "episode, not the job.\n"
         "--quick runs a small job (a few steps) to check everything end to end.\n"
         "--cluster runs the ranks on the nodes of a cluster (rlforge head / rlforge node);\n"
         "--placement split puts the policy and ref in one placement group and the engines in\n"
         "another (one core each on a 2-core machine; other nodes in a cluster).\n"
         "--mode one_step_off generates the next batch while this one trains; fully_async keeps\n"
         "the engines generating --max-staleness batches ahead (both need --placement split).\n"
         "Rollouts staler than --max-staleness versions are dropped; --pause says what weight\n"
         "updates do to partial rollouts (keep: continue on the new weights; abort: redo);\n"
         "--tis corrects for the engines' log-probs (truncated importance sampling). --eval-every\n"
         "measures held-out accuracy every N steps (the accuracy-vs-time curve in the metrics).\n"
         "--checkpoint-every N saves the policy, the rollouts waiting and finished and\n"
         "the job's state into --checkpoint-dir; --resume continues from the latest one.\n"
         "--max-restarts N (with --placement split) recovers from up to N losses of the\n"
         "engines (their node dying or hanging): the engines are placed again (waiting up to\n"
         "--recovery-timeout seconds, default 60, for room), get the policy's weights, and the\n"
         "rollouts they held are generated again; the trainer loses nothing.\n";
}

} // namespace rlforge::examples::grpo
