// The main job (scripts/main): GRPO on multi-digit addition ("37+48=" -> "85<eos>") with a
// colocated policy, reference model and two inference engines on one node with virtual GPUs.
// --task sort runs the same job on sorting lists of distinct numbers, whose answers are long;
// --task count on counting in steps, whose prompts are short and answers long.
//
// One placement group of two 1-GPU bundles holds everything, SkyRL's `colocate_all` layout: the
// policy (2 data-parallel ranks), the reference model (2 ranks) and the engines (2 ranks) take
// 0.2 GPU each on both bundles, and the dispatcher keeps only the role being called on the
// device (offload / onload, engine sleep / wake). The job:
//  1. warm-starts the policy with a short supervised run (cross-entropy on the answers) that
//     stops once greedy accuracy on a validation sample of TRAINING problems reaches
//     --sft-target (or after --sft-steps), so GRPO starts from a partly competent model;
//  2. syncs the weights to the engines and measures greedy accuracy on the held-out problems
//     (never seen in training);
//  3. runs GRPO: per step the engines sample --group answers for each of --prompts training
//     problems, the reward is 1 for the exact answer followed by <eos> (else 0; sort: partial
//     credit for the numbers in place before the first mistake), advantages are
//     GRPO's group-normalised scores (token-mean reduction), the policy's log-probs before the
//     update are the PPO "old" ones, the reference's feed the k3 KL loss, the policy takes
//     --epochs PPO-clip steps on the samples (learning rate: cosine decay from --lr to --lr/10)
//     and its weights are synced to the engines;
//  4. measures held-out accuracy again, writes the metrics JSONL and the reward-curve PNG
//     (gnuplot), and checks the gain (full run: at least the task's goal, 20 points for arith;
//     --quick: that the outputs are valid).
//
// With --env CMD --model DIR the task is instead an environment program's multi-turn episodes
// (examples/grpo/env_job.hpp): the model in DIR, its tokenizer and chat template, the same
// colocated roles and GRPO update; no warm start and no held-out evaluation.
//
//   grpo [--steps N] [--seed S] [--metrics FILE] [--plot FILE] [--quiet] [--quick] ...
//   grpo --env 'python3 examples/envs/guess_number.py' --model DIR [--quick] ...
//   (grpo --help lists every flag)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/engine.hpp"
#include "actors/node.hpp"
#include "actors/placement_manager.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/checkpoint.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/system_config.hpp"

#include "../common/driver.hpp"
#include "examples/grpo/engine_recovery.hpp"
#include "examples/grpo/trainer_recovery.hpp"
#include "examples/grpo/env_job.hpp"
#include "examples/grpo/mode_comparison.hpp"
#include "examples/grpo/options.hpp"
#include "examples/grpo/policy_update.hpp"
#include "examples/grpo/report.hpp"
#include "examples/grpo/task_choice.hpp"
#include "examples/grpo/task_job.hpp"
#include "prompt/chat_prompt.hpp"
#include "rl/rl_loop.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;
namespace report = rlforge::examples::report;
namespace fs = std::filesystem;
using rlforge::examples::grpo::run_task;
using rlforge::examples::grpo::task_result;

namespace {

constexpr const char* prog = "grpo";

using clock_type = std::chrono::steady_clock;


/// Spawns one rank per bundle of `pg` (times `per_bundle`) of `kind` as group `role` at `gpu`
/// GPU per rank (reserved through the manager, so the roles' shares add up exactly).
actor_group spawn_role(const examples::fatal_errors& or_die, const caf::actor& manager,
                       const placement_group_info& pg, const std::string& role,
                       const std::string& kind, bool collectives, double gpu,
                       int per_bundle = 1) {
  return or_die.group(
      actor_group::spawn(or_die.sys, examples::role_group_spec(manager, pg, role, kind,
                                                              collectives, gpu, per_bundle)),
      "spawn group");
}


/// What the --env mode needs from the model directory, read before anything starts.
struct env_model {
  std::unique_ptr<prompt::chat_prompt> chat;
  int64_t context = 0; ///< max_position_embeddings
};

/// Loads --model's tokenizer, chat template and config for --env; "" or the reason it cannot.
std::string load_env_model(const examples::grpo::options& opt, env_model& out) {
  try {
    out.chat = std::make_unique<prompt::chat_prompt>(prompt::chat_prompt::load(opt.model));
  } catch (const std::exception& e) {
    return "--model " + opt.model + ": cannot load its tokenizer: " + e.what();
  }
  if (!out.chat->has_template())
    return "--model " + opt.model + " has no chat template (tokenizer_config.json has no "
           "chat_template); --env builds every prompt with it";
  be::model_config config;
  try {
    config = be::load_model_config(opt.model);
  } catch (const std::exception& e) {
    return "--model " + opt.model + ": " + e.what();
  }
  if (out.chat->tokenizer().vocab_size() > config.vocab_size)
    return "--model " + opt.model + ": its tokenizer has " +
           std::to_string(out.chat->tokenizer().vocab_size()) + " ids, more than the model's " +
           std::to_string(config.vocab_size);
  out.context = config.max_position_embeddings;
  return "";
}

/// Checks what every run writes (the metrics, the plot) and prints the step-time breakdown;
/// returns 0, or 1 after printing what is wrong.
int check_outputs(const examples::grpo::options& opt, const report::plot_result& drawn) {
  try {
    auto records = report::read_metrics(opt.metrics);
    if (static_cast<int>(records.size()) != opt.steps) {
      std::printf("grpo: FAILED: %zu metrics records, expected %d\n", records.size(), opt.steps);
      return 1;
    }
    // The step-time breakdown: medians over the steps (docs/PERFORMANCE.md quotes this line).
    auto median_of = [&](auto field) {
      std::vector<double> v;
      for (auto& r : records)
        v.push_back(field(r));
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    auto field = [](const char* key) {
      return [key](const nlohmann::json& r) { return r.at(key).get<double>(); };
    };
    double step_s = median_of(field("seconds"));
    double gen_s = median_of(field("generate_seconds"));
    double train_s = median_of(field("train_seconds"));
    double sync_s = median_of(field("sync_seconds"));
    double tps = median_of(field("tokens_per_second"));
    auto share = [&](double x) { return step_s > 0 ? 100 * x / step_s : 0.0; };
    // In the asynchronous modes the engines generate while the trainer trains: a step's
    // "generate" is only its wait for finished rollouts, and tokens over that wait mean nothing.
    const bool sync_mode = opt.mode == "sync";
    std::printf("grpo: step time (medians of %zu steps) %.3f s: %s %.3f s (%.0f%%), train "
                "%.3f s (%.0f%%), sync %.4f s (%.1f%%)",
                records.size(), step_s, sync_mode ? "generate" : "wait for rollouts", gen_s,
                share(gen_s), train_s, share(train_s), sync_s, share(sync_s));
    if (sync_mode)
      std::printf("; generation %.0f tok/s", tps);
    std::printf("\n");
  } catch (const std::exception& e) {
    std::printf("grpo: FAILED: %s\n", e.what());
    return 1;
  }
  if (drawn.written && !report::is_png(opt.plot)) {
    std::printf("grpo: FAILED: %s is not a PNG\n", opt.plot.c_str());
    return 1;
  }
  return 0;
}

/// The RL loop's line at the end of a job, e.g. `grpo: mode fully_async: 960 samples in 12.0 s
/// of GRPO = 80.0 samples/s; rollouts by staleness {0:10 1:110}, 0 dropped, 2 requeued`.
void print_loop_summary(const std::string& mode, int64_t trained, const char* trained_what,
                        double seconds, const char* units,
                        const std::vector<int64_t>& staleness_counts, int64_t dropped,
                        const std::string& resubmitted) {
  std::string hist;
  for (size_t k = 0; k < staleness_counts.size(); ++k)
    hist += (k ? " " : "") + std::to_string(k) + ":" + std::to_string(staleness_counts[k]);
  std::printf("grpo: mode %s: %lld %s in %.1f s of GRPO = %.1f/s; %s by staleness {%s}, %lld "
              "dropped, %s\n",
              mode.c_str(), static_cast<long long>(trained), trained_what, seconds,
              seconds > 0 ? static_cast<double>(trained) / seconds : 0.0, units, hist.c_str(),
              static_cast<long long>(dropped), resubmitted.c_str());
}

/// `grpo --compare BASELINE.jsonl OTHER.jsonl... [--plot PNG]`: compares runs of the modes
/// (examples/grpo/mode_comparison.hpp) and draws held-out accuracy against wall time.
int compare(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  std::string png;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--plot") {
      if (i + 1 >= args.size() || args[i + 1].empty()) {
        std::fprintf(stderr, "%s: --plot needs a non-empty path\n", prog);
        return 2;
      }
      png = args[++i];
    } else {
      files.push_back(args[i]);
    }
  }
  if (files.size() < 2) {
    std::fprintf(stderr, "%s: --compare needs the baseline's metrics and at least one more "
                 "(grpo --compare SYNC.jsonl OTHER.jsonl... [--plot PNG])\n", prog);
    return 2;
  }
  std::vector<examples::grpo::run_summary> runs;
  std::vector<report::accuracy_curve> curves;
  try {
    for (const auto& f : files) {
      auto records = report::read_metrics(f);
      runs.push_back(examples::grpo::summarize(records));
      if (!runs.back().accuracy.empty())
        curves.push_back({runs.back().mode, runs.back().accuracy});
    }
    std::printf("%s", examples::grpo::compare_runs(runs).c_str());
    if (!png.empty() && !curves.empty()) {
      auto drawn = report::run_gnuplot(
          report::accuracy_plot_script(curves, png,
                                       "GRPO: held-out accuracy against wall time by mode"),
          png);
      if (drawn.written)
        std::printf("grpo: accuracy-vs-time plot written to %s\n", png.c_str());
      else
        std::printf("grpo: no plot: %s\n", drawn.message.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: --compare: %s\n", prog, e.what());
    return 2;
  }
  return 0;
}

/// The job; returns the exit status (fatal runtime errors end it through `fatal_errors`).
int run(int argc, char** argv) {
  if (argc > 1 && std::string{argv[1]} == "--compare")
    return compare(std::vector<std::string>(argv + 2, argv + argc));
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = examples::grpo::parse_options(args);
  if (parsed.help) {
    std::printf("%s", examples::grpo::usage(prog, args).c_str());
    return 0;
  }
  if (!parsed.error.empty()) {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", prog, parsed.error.c_str(), prog);
    return 2;
  }
  const auto opt = parsed.opts;
  const bool env_mode = !opt.env_command.empty();
  std::unique_ptr<examples::grpo::verifiable_task> task_ptr;
  env_model envm;
  if (env_mode) {
    if (auto why = load_env_model(opt, envm); !why.empty()) {
      std::fprintf(stderr, "%s: %s\n", prog, why.c_str());
      return 2;
    }
  } else {
    try {
      task_ptr = examples::grpo::make_task(opt);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "%s: %s\n", prog, e.what());
      return 2;
    }
  }
  // A resumed run keeps the records of the steps its checkpoint covers and writes the rest.
  std::string kept_records;
  if (opt.resume) {
    std::optional<int64_t> latest;
    try {
      latest = be::latest_step(opt.checkpoint_dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: --resume: %s\n", prog, e.what());
      return 2;
    }
    if (!latest) {
      std::fprintf(stderr, "%s: --resume: no committed checkpoint in '%s'\n", prog,
                   opt.checkpoint_dir.c_str());
      return 2;
    }
    if (*latest >= opt.steps) {
      std::fprintf(stderr, "%s: --resume: the checkpoint is at step %lld; --steps %d leaves "
                   "nothing to run\n", prog, static_cast<long long>(*latest), opt.steps);
      return 2;
    }
    std::ifstream in(opt.metrics);
    for (std::string line; std::getline(in, line);) {
      auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_object() && r.contains("step") && r["step"].is_number_integer() &&
          r["step"].get<int64_t>() <= *latest)
        kept_records += line + "\n";
    }
  }
  std::ofstream metrics(opt.metrics, std::ios::trunc);
  if (!metrics) {
    std::fprintf(stderr, "%s: cannot open metrics file '%s'\n", prog, opt.metrics.c_str());
    return 2;
  }
  metrics << kept_records;
  const auto job_start = clock_type::now();

  runtime::system_config cfg;
  if (!examples::configure(cfg, 2, prog, opt.cluster, opt.tls, opt.log_level,
                           opt.log_format)) // 2 virtual GPUs
    return 2;
  register_worker_kinds();
  register_engine_kind();
  caf::actor_system sys{cfg};
  examples::fatal_errors or_die{prog, sys};
  return examples::run_driver(or_die, [&]() -> int {
    auto manager = examples::placement(or_die, sys, cfg);
    placement_client pgs{sys, manager};
    trainer_client client{sys, or_die.dispatcher(), 300s};

    using examples::grpo::split_layout;
    const resource_amounts gpu_bundle = split_layout::bundle();
    const bool split = opt.placement == "split";
    actor_group policy, ref, engines;
    if (!split) {
      // One placement group, every role on both bundles at 0.2 GPU per rank.
      auto pg = or_die(pgs.create({"colocated", {gpu_bundle, gpu_bundle}, "pack", 30}),
                       "placement group");
      policy = spawn_role(or_die, manager, pg, "policy", "policy", true, 0.2);
      ref = spawn_role(or_die, manager, pg, "ref", "ref", true, 0.2);
      engines = spawn_role(or_die, manager, pg, "engines", "engine", false, 0.2);
    } else {
      // Training and generation in placement groups of their own, one thread each: on one
      // 2-core node a core each, in a cluster of 1-GPU nodes a node each.
      auto training = or_die(
          pgs.create({split_layout::training, {gpu_bundle}, "pack", 30}),
          "placement group");
      auto generation = or_die(
          pgs.create({split_layout::generation, {gpu_bundle}, "pack", 30}),
          "placement group");
      policy = spawn_role(or_die, manager, training, "policy", "policy", true,
                          split_layout::trainer_gpu_per_rank);
      ref = spawn_role(or_die, manager, training, "ref", "ref", true,
                       split_layout::trainer_gpu_per_rank);
      engines = spawn_role(or_die, manager, generation, "engines", "engine", false,
                           split_layout::engine_gpu_per_rank);
    }
    or_die(client.register_group("policy", policy), "register policy");
    or_die(client.register_group("ref", ref), "register ref");
    or_die(client.register_engines(engines), "register engines");

    // Every role gets a model before colocation starts moving them. A built-in task's
    // reference model is replaced by the warm-started weights later and the engines get them by
    // weight sync; with --env all three start from the model directory.
    model_spec model;
    if (env_mode)
      model.hf_dir = opt.model;
    else
      // At least the examples' usual 64 positions: the arithmetic task's model stays as it was.
      model.config_json = examples::llama_config(task_ptr->vocab_size(),
                                                 std::max<int64_t>(64, task_ptr->context()))
                              .dump();
    model.seed = opt.seed;
    model.compute_dtype = opt.compute_dtype;
    model.batch_invariant = opt.batch_invariant;
    auto params = or_die(client.init_model("policy", model), "init_model policy");
    or_die(client.init_model("ref", model), "init_model ref");
    or_die(client.init_model("engines", model), "init_model engines");
    if (!split)
      or_die(client.colocate({"policy", "ref", "engines"}), "colocate");
    or_die(client.set_weight_transport(opt.weight_transport), "--weight-transport");
    or_die(client.set_weight_delta(opt.delta_sync), "--delta-sync");
    // Where the ranks are, for the opening line.
    std::string layout_text =
        "policy (2 DP ranks), ref (2) and engines (2) colocated on 2 virtual GPUs at 0.2 each";
    if (split)
      layout_text = "policy (1 rank) and ref (1) on node '" +
                    or_die(policy.ranks(), "ranks").at(0).node_id + "', engines (1) on node '" +
                    or_die(engines.ranks(), "ranks").at(0).node_id + "' (placement split, mode " +
                    opt.mode + ")";

    std::vector<double> rewards;
    std::string title;
    task_result task_res;
    examples::grpo::env_job_result env_res;
    // --max-restarts: lost engines are replaced in both kinds of run, a lost trainer in task
    // runs (the budget is shared).
    examples::grpo::restart_budget restarts{opt.max_restarts};
    examples::grpo::engine_recovery engine_recovery{or_die, pgs,   manager, engines,
                                                    model,  opt, restarts};
    if (env_mode) {
      std::printf("grpo: %lld-parameter model from %s; %s; task: episodes of '%s', %d x %d "
                  "per step, at most %d turns of %d tokens\n",
                  static_cast<long long>(params), opt.model.c_str(), layout_text.c_str(),
                  opt.env_command.c_str(), opt.prompts, opt.group, opt.max_turns, opt.turn_tokens);
      or_die(examples::grpo::configure_training(client, opt), "set_algorithm_config");
      env_res = examples::grpo::run_env_job(or_die, client, engine_recovery, opt, *envm.chat,
                                            envm.context,
                                            examples::grpo::training_config(opt).use_kl_loss,
                                            metrics);
      rewards = env_res.rewards;
      title = "GRPO on the episodes of " + opt.env_argv.back();
    } else {
      std::printf("grpo: %lld-parameter Llama; %s; task: %s, %d held-out problems\n",
                  static_cast<long long>(params), layout_text.c_str(),
                  task_ptr->description().c_str(), opt.held_out);
      examples::grpo::trainer_recovery trainer_recovery{or_die, client, pgs, manager, policy,
                                                        ref,    model,  opt, restarts};
      task_res = run_task(or_die, client, opt, *task_ptr, model, engine_recovery,
                          trainer_recovery, metrics);
      rewards = task_res.rewards;
      title = "GRPO on " + task_ptr->description() + ": held-out accuracy " +
              std::to_string(static_cast<int>(std::lround(100 * task_res.acc_before))) + "% -> " +
              std::to_string(static_cast<int>(std::lround(100 * task_res.acc_after))) + "%";
    }
    metrics.close();

    // Which transport each engine rank's weights took (in_process, shm or gloo).
    auto ledger = or_die(client.status(), "status");
    std::string transports;
    for (auto& [rank, transport] : ledger["last_sync"].items())
      transports += " " + rank + "=" + transport.get<std::string>();
    std::printf("grpo: weight sync transports:%s\n", transports.c_str());
    auto syncs = or_die(client.syncs(), "syncs");
    if (syncs.count > 0)
      std::printf("grpo: %lld weight syncs%s: %.2f MB sent per sync on average, %.3f s each\n",
                  static_cast<long long>(syncs.count), opt.delta_sync ? " (delta)" : "",
                  static_cast<double>(syncs.bytes) / 1e6 / static_cast<double>(syncs.count),
                  syncs.seconds / static_cast<double>(syncs.count));
    for (auto* g : {&policy, &ref, &engines})
      g->stop();
    examples::shutdown(client, manager);

    report::plot_spec plot;
    plot.rewards = rewards;
    plot.title = title;
    plot.png_path = opt.plot;
    plot.smoothing = std::max(1, std::min(10, opt.steps / 5));
    auto drawn = report::plot_reward_curve(plot);
    if (drawn.written)
      std::printf("grpo: reward curve written to %s\n", opt.plot.c_str());
    else
      std::printf("grpo: no plot: %s\n", drawn.message.c_str());
    std::printf("grpo: metrics written to %s (%d records)\n", opt.metrics.c_str(), opt.steps);
    auto [first, last] = examples::first_last_means(rewards, 5);

    if (env_mode) {
      std::printf("grpo: mean reward %.3f -> %.3f; %lld episodes: %lld ended by the environment, "
                  "%lld stopped by the driver, %lld failed; %.0f s in all\n",
                  first, last, static_cast<long long>(env_res.episodes),
                  static_cast<long long>(env_res.done), static_cast<long long>(env_res.stopped),
                  static_cast<long long>(env_res.failed), examples::seconds_since(job_start));
      for (const auto& [message, count] : env_res.errors)
        std::printf("grpo: failed episodes: %lld x %s\n", static_cast<long long>(count),
                    message.c_str());
      print_loop_summary(opt.mode, env_res.trained, "episodes trained on", env_res.grpo_seconds,
                         "groups", env_res.staleness_counts, env_res.dropped,
                         std::to_string(env_res.resampled) + " turns sampled again");
      if (int bad = check_outputs(opt, drawn))
        return bad;
      // The environment's failures are its episodes'; a job none of whose episodes ran has
      // nothing to show, though.
      if (env_res.failed == env_res.episodes) {
        std::printf("grpo: FAILED: every episode failed (%lld); see the errors above\n",
                    static_cast<long long>(env_res.episodes));
        return 1;
      }
      if (opt.min_final_reward >= 0 && last < opt.min_final_reward) {
        std::printf("grpo: FAILED: the mean reward of the last steps is %.3f, the goal is %.3f\n",
                    last, opt.min_final_reward);
        return 1;
      }
      std::printf("grpo: ok: %s run finished, %lld of %lld episodes ran%s%s\n",
                  opt.quick ? "quick" : "full",
                  static_cast<long long>(env_res.episodes - env_res.failed),
                  static_cast<long long>(env_res.episodes),
                  drawn.written ? ", metrics and plot valid" : ", metrics valid",
                  opt.min_final_reward >= 0 ? ", final reward goal reached" : "");
      return 0;
    }

    std::printf("grpo: mean reward %.3f -> %.3f; held-out accuracy %.1f%% (after SFT) -> %.1f%% "
                "(after GRPO), %+.1f points; %.0f s in all\n",
                first, last, 100 * task_res.acc_before, 100 * task_res.acc_after,
                100 * (task_res.acc_after - task_res.acc_before),
                examples::seconds_since(job_start));
    // What the RL loop did: throughput and staleness (docs/PERFORMANCE.md compares the modes).
    print_loop_summary(opt.mode, task_res.samples, "samples", task_res.grpo_seconds, "rollouts",
                       task_res.staleness_counts, task_res.dropped,
                       std::to_string(task_res.requeued) + " requeued");
    // The outputs must be valid in every mode; the accuracy goal applies to full runs only.
    if (int bad = check_outputs(opt, drawn))
      return bad;
    if (opt.quick) {
      std::printf("grpo: ok: quick run finished, metrics%s valid\n",
                  drawn.written ? " and plot" : "");
      return 0;
    }
    const double gain = task_res.acc_after - task_res.acc_before;
    const double required_gain = task_ptr->required_gain();
    if (!opt.accuracy_goal) {
      std::printf("grpo: ok: full run finished, held-out accuracy %+.1f points (not judged: "
                  "--no-goal)\n",
                  100 * gain);
      return 0;
    }
    if (gain < required_gain) {
      std::printf("grpo: FAILED: held-out accuracy rose by %.1f points, the goal is %.0f\n",
                  100 * gain, 100 * required_gain);
      return 1;
    }
    std::printf("grpo: ok: held-out accuracy up %.1f points (goal %.0f)\n", 100 * gain,
                100 * required_gain);
    return 0;
  });
}

} // namespace

int main(int argc, char** argv) {
  // Backends report bad data by throwing; the job says what went wrong instead of aborting.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: %s\n", prog, e.what());
    return 1;
  }
}
