// The GRPO job on a built-in task (task_job.hpp).
#include "examples/grpo/task_job.hpp"

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
#include "examples/grpo/engine_reading.hpp"
#include "examples/grpo/engine_recovery.hpp"
#include "examples/grpo/env_job.hpp"
#include "examples/grpo/mode_comparison.hpp"
#include "examples/grpo/options.hpp"
#include "examples/grpo/policy_update.hpp"
#include "examples/grpo/report.hpp"
#include "prompt/chat_prompt.hpp"
#include "rl/rl_loop.hpp"

namespace rlforge::examples::grpo {

using namespace rlforge::actors;
namespace be = rlforge::backends;
namespace fs = std::filesystem;

namespace {

constexpr int validation_problems = 100; ///< training problems the warm start is checked on
constexpr int sft_check_every = 10;      ///< warm-start steps between validation checks

using clock_type = std::chrono::steady_clock;

/// Seconds since the Unix epoch (a recovery record's "seen_at_unix": other processes on the
/// machine, a benchmark that caused the loss, compare it with their own clock).
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Greedy answers of the engines to `prompts`, as their mean accuracy (`verifiable_task::accuracy`).
double greedy_accuracy(const examples::fatal_errors& or_die, trainer_client& client,
                       const verifiable_task& task,
                       const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<sample_request> requests;
  for (const auto& p : prompts) {
    sample_request r;
    r.prompt = p;
    r.max_tokens = task.max_answer_tokens();
    r.temperature = 0;
    r.stop_token_ids = {task.eos_id()};
    requests.push_back(std::move(r));
  }
  auto out = or_die(client.generate(requests), "generate (greedy evaluation)");
  std::vector<std::vector<int64_t>> responses;
  for (auto& o : out)
    responses.push_back(std::move(o.tokens));
  return mean_accuracy(task, prompts, responses);
}

/// How the warm start ended.
struct warm_start_result {
  int steps = 0;              ///< steps taken
  double validation = -1;     ///< last validation accuracy (-1 when never measured)
  bool reached = false;       ///< stopped because the validation target was reached
};

/// Supervised warm start.
warm_start_result warm_start(const examples::fatal_errors& or_die, trainer_client& client,
               const examples::grpo::options& opt, const verifiable_task& task,
               const std::vector<std::vector<int64_t>>& validation, std::mt19937_64& rng) {
  be::adam_params adam;
  adam.learning_rate = opt.sft_lr;
  adam.grad_clip_norm = 1.0;
  warm_start_result res;
  for (int s = 1; s <= opt.sft_steps; ++s) {
    std::vector<std::vector<int64_t>> prompts, targets;
    for (int i = 0; i < opt.sft_batch; ++i) {
      prompts.push_back(task.sample_prompt(rng));
      targets.push_back(task.target(prompts.back()));
    }
    auto batch = be::from_sequences(prompts, targets);
    // Losses are masked sums: weighting each answer token by 1/tokens makes it a token mean.
    auto& mask = batch.tensors["loss_mask"];
    mask = mask / mask.sum();
    auto out = or_die(client.forward_backward("policy", batch, "cross_entropy"),
                      "warm start forward_backward");
    or_die(client.optim_step("policy", adam), "warm start optim_step");
    bool check = opt.sft_target > 0 && (s % sft_check_every == 0 || s == opt.sft_steps);
    double val = -1;
    if (check) {
      or_die(client.save_weights_for_sampler("policy"), "save_weights_for_sampler");
      val = greedy_accuracy(or_die, client, task, validation);
    }
    if (!opt.quiet && (check || s % 10 == 0 || s == opt.sft_steps)) {
      std::printf("\rwarm start %4d/%d  loss %.4f", s, opt.sft_steps, out.metric("loss:sum"));
      if (val >= 0)
        std::printf("  validation accuracy %5.1f%%", 100 * val);
      std::fflush(stdout);
    }
    res.steps = s;
    if (check)
      res.validation = val;
    if (check && val >= opt.sft_target) {
      res.reached = true;
      break;
    }
  }
  if (!opt.quiet)
    std::printf("\n");
  return res;
}

} // namespace

task_result run_task(const examples::fatal_errors& or_die, trainer_client& client,
                     const examples::grpo::options& opt, const verifiable_task& task,
                     const model_spec& model, examples::grpo::engine_recovery& engines,
                     examples::grpo::trainer_recovery& trainer, std::ostream& metrics) {
  std::mt19937_64 rng(opt.seed * 0x2545F4914F6CDD1DULL + 17);
  task_result res;
  const auto max_tokens = task.max_answer_tokens();
  const auto held_out = task.held_out_prompts();
  int64_t resumed_step = 0;
  nlohmann::json resumed; // the checkpoint's trainer state (--resume)
  if (opt.resume) {
    // 1-2. From the latest checkpoint instead: the policy (with its optimizer) and the ref.
    resumed_step =
        or_die(client.load_checkpoint(opt.checkpoint_dir, -1, {"policy"}), "load_checkpoint");
    // The frozen reference is kept once, as a model directory next to the checkpoints.
    or_die(client.init_model("ref", from_directory(model, ref_model_dir(opt))),
           "init_model ref (--resume)");
    try {
      resumed = be::read_trainer_state(opt.checkpoint_dir, resumed_step);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "grpo: --resume: %s\n", e.what());
      throw examples::fatal_exit{1};
    }
  } else {
    // 1. Warm start.
    std::vector<std::vector<int64_t>> validation;
    {
      std::mt19937_64 vrng(opt.seed + 1000003);
      for (int i = 0; i < validation_problems; ++i)
        validation.push_back(task.sample_prompt(vrng));
    }
    auto t_sft = clock_type::now();
    auto sft = warm_start(or_die, client, opt, task, validation, rng);
    double sft_seconds = examples::seconds_since(t_sft);
    if (opt.sft_target > 0 && !sft.reached)
      std::printf("grpo: note: the warm start did not reach its validation target %.0f%% in %d "
                  "steps (last %.0f%%); GRPO starts from a weaker model\n",
                  100 * opt.sft_target, sft.steps, 100 * sft.validation);

    // 2. Engines get the warm-started weights; the reference model is a copy of them.
    res.first_version =
        or_die(client.save_weights_for_sampler("policy"), "save_weights_for_sampler");
    res.acc_before = greedy_accuracy(or_die, client, task, held_out);
    std::printf("grpo: warm start %d steps (%.1f s); held-out accuracy after SFT: %.1f%%\n",
                sft.steps, sft_seconds, 100 * res.acc_before);
    auto export_dir =
        fs::temp_directory_path() / ("rlforge_grpo_" + std::to_string(::getpid()));
    or_die(client.save_hf_model("policy", export_dir.string()), "save_hf_model");
    or_die(client.init_model("ref", from_directory(model, export_dir.string())),
           "init_model ref");
    std::error_code ec;
    fs::remove_all(export_dir, ec);
    if (opt.checkpoint_every > 0)
      or_die(client.save_hf_model("ref", ref_model_dir(opt)), "save_hf_model ref (checkpoints)");
  }
  const bool use_kl = examples::grpo::training_config(opt).use_kl_loss;
  or_die(examples::grpo::configure_training(client, opt), "set_algorithm_config");

  // 3. GRPO through the RL loop (rl/rl_loop.hpp): the engines generate each step's rollouts
  //    (--mode: before the step, or batches ahead while the policy trains), the policy trains
  //    on them and its weights go to the engines without draining them.
  be::adam_params adam;
  adam.learning_rate = opt.lr;
  adam.grad_clip_norm = 1.0;
  rl::loop_options lo;
  rl::parse_rl_mode(opt.mode, lo.mode);
  lo.batch_rollouts = opt.prompts;
  lo.max_staleness = opt.max_staleness;
  lo.pause_mode = opt.pause;
  auto source = [&](int64_t) {
    // Drawn in id order from the job's generator: sync mode asks for each step's requests just
    // before the step, as the loop did before it had modes. A rollout carries its prompt, which
    // is all its reward needs.
    sample_request r;
    r.prompt = task.sample_prompt(rng);
    r.max_tokens = max_tokens;
    r.temperature = opt.temperature;
    r.has_seed = true;
    r.seed = rng();
    r.stop_token_ids = {task.eos_id()};
    r.num_samples = opt.group;
    return r;
  };
  // A pointer: a recovery replaces the loop (its producer talked to the lost ranks).
  auto loop = std::make_unique<rl::rl_loop>(or_die.sys, client, lo, source);
  loop->set_version(res.first_version);
  int64_t samples_trained = 0;
  // The job's state back from a checkpoint's trainer state (--resume, a trainer recovery): a
  // fresh loop holding the rollouts waiting and finished at the checkpoint, with their
  // accounting (the waiting ones are generated again, the finished ones are trained on as if
  // nothing happened), the generator and the figures so far;
  // then the engines get the policy's weights. The new weight version.
  auto restore_job = [&](const nlohmann::json& state, const char* what) {
    loop.reset();
    loop = std::make_unique<rl::rl_loop>(or_die.sys, client, lo, source);
    auto restored = loop->restore(state.value("loop", nlohmann::json{}));
    if (!restored) {
      std::fprintf(stderr, "grpo: %s: %s\n", what, or_die.sys.render(restored.error()).c_str());
      throw examples::fatal_exit{1};
    }
    try {
      std::istringstream(restored->at("rng").get<std::string>()) >> rng;
      res.acc_before = restored->at("acc_before").get<double>();
      res.rewards = restored->at("rewards").get<std::vector<double>>();
      samples_trained = restored->value("samples", int64_t{0});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "grpo: %s: the checkpoint's job state is malformed: %s\n", what,
                   e.what());
      throw examples::fatal_exit{1};
    }
    return or_die(loop->update_weights(), what);
  };
  int first_step = 1;
  if (opt.resume) {
    // The engines get the resumed policy; this process counts the samples it trains on.
    res.first_version = restore_job(resumed, "--resume");
    samples_trained = 0;
    first_step = static_cast<int>(resumed_step) + 1;
    const auto& rs = resumed.at("loop").at("rollouts");
    std::printf("grpo: resumed at step %lld from %s: %zu rollouts generated again, %zu finished "
                "kept; %lld taken and %lld dropped before; weight version %lld\n",
                static_cast<long long>(resumed_step), opt.checkpoint_dir.c_str(),
                rs.at("waiting").size(), rs.at("done").size(),
                static_cast<long long>(rs.at("taken").get<int64_t>()),
                static_cast<long long>(rs.at("dropped").get<int64_t>()),
                static_cast<long long>(res.first_version));
  }
  // A checkpoint: the policy's state (the frozen ref was written once, as ref_model/), then
  // (committed last) the loop's rollouts and the job's own state: its generator and the figures
  // so far.
  auto checkpoint = [&](int step) {
    std::ostringstream rng_text;
    rng_text << rng;
    auto snap = or_die(loop->snapshot({{"rng", rng_text.str()},
                                      {"acc_before", res.acc_before},
                                      {"rewards", res.rewards},
                                      {"samples", samples_trained}}),
                       "rollout snapshot");
    or_die(client.save_checkpoint(opt.checkpoint_dir, step, {"policy"},
                                  nlohmann::json{{"loop", snap}}),
           "save_checkpoint");
  };
  // The first checkpoint is the GRPO start's (step 0): a trainer lost before step N is rolled
  // back to it.
  if (opt.checkpoint_every > 0 && !opt.resume)
    checkpoint(0);
  // Lost engines (--max-restarts): new engines get the policy's weights, then the rollouts the
  // lost ones held, waiting or finished (a fresh loop restored from the old one's snapshot);
  // the trainer keeps its state. False when this was not an engines' loss or no restart is
  // left: the caller fails with `err`.
  nlohmann::json recoveries = nlohmann::json::array(); // this step's
  auto t_grpo = clock_type::now();
  auto recover = [&](const caf::error& err, int step) {
    if (!engines.budget().can_restart() || !engines.engines_lost())
      return false;
    const auto t0 = clock_type::now();
    const double seen_at = unix_seconds();
    const auto lost = or_die.sys.render(err);
    std::printf("\ngrpo: step %d: the engines are lost (%s); replacing them (restart %d of %d, "
                "waiting up to %.0f s for room)\n",
                step, lost.c_str(), engines.budget().used + 1, opt.max_restarts,
                opt.recovery_timeout);
    auto snap = or_die(loop->snapshot(), "rollout snapshot (engine recovery)");
    loop.reset();
    // Every rollout held is generated again on the new engines, finished ones too: the sync
    // below gives the weights a new version (the same weights when the loss came during
    // generation), so rollouts of the old version would count as stale and be dropped.
    auto& held = snap.at("rollouts");
    const auto finished = held.at("done").size();
    for (auto& r : held.at("done")) {
      r["samples"] = nlohmann::json::array();
      held.at("waiting").push_back(std::move(r));
    }
    held["done"] = nlohmann::json::array();
    auto& waiting = held.at("waiting");
    std::sort(waiting.begin(), waiting.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("id").get<int64_t>() < b.at("id").get<int64_t>();
    });
    auto node = or_die(engines.replace(client), "engine recovery");
    auto version =
        or_die(client.save_weights_for_sampler("policy"), "weight sync to the new engines");
    loop = std::make_unique<rl::rl_loop>(or_die.sys, client, lo, source);
    or_die(loop->restore(snap), "rollouts back to the new engines");
    loop->set_version(version);
    const double seconds = examples::seconds_since(t0);
    std::printf("grpo: step %d: engines on node '%s' at weight version %lld after %.2f s; %zu "
                "rollouts generated again (%zu of them had finished)\n",
                step, node.c_str(), static_cast<long long>(version), seconds, waiting.size(),
                finished);
    recoveries.push_back({{"lost", lost},
                          {"seen_at_unix", seen_at},
                          {"at_grpo_seconds", examples::seconds_since(t_grpo)},
                          {"engines_node", node},
                          {"weight_version", version},
                          {"regenerated", waiting.size()},
                          {"steps_replayed", 0},
                          {"seconds", seconds}});
    return true;
  };
  // Where the metrics file ends after each step's record (and before the first step's), so a
  // rollback can cut it back to a checkpoint's step.
  std::map<int, std::streampos> record_end{{first_step - 1, metrics.tellp()}};
  // A lost trainer (--max-restarts, `failure` a call that failed during step `step`): the
  // policy and ref are placed again and restored from the last checkpoint; the job's state and
  // its metrics go back to that checkpoint's step, which is returned (the steps after it are
  // replayed from the same data). Reports `failure` and ends the job when this was no trainer's
  // loss, no restart is left, or nothing can be rolled back to.
  auto recover_trainer = [&](const examples::deferred_failure& failure, int step) {
    if (!trainer.budget().can_restart() || !trainer.trainer_lost())
      or_die.fail(failure.error, failure.what.c_str());
    const auto t0 = clock_type::now();
    const double seen_at = unix_seconds();
    const auto lost = or_die.sys.render(failure.error);
    std::printf("\ngrpo: step %d: the trainer is lost (%s failed: %s); placing the policy and "
                "ref again and rolling back to the last checkpoint (restart %d of %d, waiting up "
                "to %.0f s for room)\n",
                step, failure.what.c_str(), lost.c_str(), trainer.budget().used + 1,
                opt.max_restarts, opt.recovery_timeout);
    loop.reset(); // its producer's rollouts belong to steps that are rolled back
    auto back = or_die(trainer.replace(), "trainer recovery");
    const auto end = record_end.find(static_cast<int>(back.step));
    if (end == record_end.end()) {
      std::fprintf(stderr, "grpo: trainer recovery: the latest checkpoint (step %lld) is older "
                   "than this run's first step (%d)\n", static_cast<long long>(back.step),
                   first_step);
      throw examples::fatal_exit{1};
    }
    nlohmann::json state;
    try {
      state = be::read_trainer_state(opt.checkpoint_dir, back.step);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "grpo: trainer recovery: %s\n", e.what());
      throw examples::fatal_exit{1};
    }
    const auto version = restore_job(state, "trainer recovery");
    // The records of the steps rolled back go; the replayed steps write them again.
    metrics.flush();
    std::error_code ec;
    fs::resize_file(opt.metrics, static_cast<uintmax_t>(end->second), ec);
    metrics.seekp(end->second);
    if (ec || !metrics) {
      std::fprintf(stderr, "grpo: trainer recovery: cannot cut %s back to step %lld: %s\n",
                   opt.metrics.c_str(), static_cast<long long>(back.step),
                   ec ? ec.message().c_str() : "seek failed");
      throw examples::fatal_exit{1};
    }
    record_end.erase(std::next(end), record_end.end());
    const double seconds = examples::seconds_since(t0);
    const int replayed = step - 1 - static_cast<int>(back.step);
    std::printf("grpo: step %d: policy and ref on node '%s', restored from the checkpoint of "
                "step %lld, engines at weight version %lld after %.2f s; replaying from step "
                "%lld (%d finished steps again)\n",
                step, back.node.c_str(), static_cast<long long>(back.step),
                static_cast<long long>(version), seconds, static_cast<long long>(back.step + 1),
                replayed);
    recoveries.push_back({{"lost", std::string{failure.what} + " failed: " + lost},
                          {"seen_at_unix", seen_at},
                          {"at_grpo_seconds", examples::seconds_since(t_grpo)},
                          {"lost_at_step", step},
                          {"trainer_node", back.node},
                          {"rolled_back_to", back.step},
                          {"weight_version", version},
                          {"regenerated", state.at("loop").at("rollouts").at("waiting").size()},
                          {"steps_replayed", replayed},
                          {"seconds", seconds}});
    return static_cast<int>(back.step);
  };
  const bool correct_off_policy = opt.mode != "sync";
  double eval_seconds = 0; // held-out evaluations, left out of the wall time
  for (int step = first_step; step <= opt.steps; ++step) {
    try {
      // A failed call of this step may be the trainer's loss: recover_trainer decides.
      examples::deferred_failures deferred{or_die, opt.max_restarts > 0};
      adam.learning_rate = examples::grpo::learning_rate(opt, step);
      report::step_stats st;
      st.step = step;
      st.total_steps = opt.steps;
      const auto engines_at_start = examples::grpo::read_engine_activity(engines.group());
      auto next = loop->next_batch();
      while (!next && recover(next.error(), step))
        next = loop->next_batch();
      auto batch = or_die(std::move(next), "rollouts");
      // Waiting for rollouts is this step's generation time (all of it in sync mode).
      st.generate_seconds = batch.wait_seconds;
      // The partial rows the engines hold as the step starts training (0 in sync mode).
      const auto engines_at_take = examples::grpo::read_engine_activity(engines.group());

      // Rewards sit on the last response token; one group per rollout.
      examples::grpo::grpo_rows rows;
      double correct = 0;
      size_t n_rows = 0;
      int64_t staleness_max = 0;
      double staleness_sum = 0;
      std::vector<int64_t> staleness_counts; // this batch's rollouts by staleness
      for (auto& r : batch.rollouts)
        n_rows += r.samples.size();
      for (size_t g = 0; g < batch.rollouts.size(); ++g) {
        auto& ro = batch.rollouts[g];
        staleness_max = std::max(staleness_max, batch.staleness[g]);
        staleness_sum += static_cast<double>(batch.staleness[g]);
        report::count_staleness(staleness_counts, batch.staleness[g]);
        for (auto& sample : ro.samples) {
          double r = task.reward(ro.request.prompt, sample.tokens);
          st.reward += r / static_cast<double>(n_rows);
          correct += r == 1.0 ? 1.0 : 0.0;
          st.tokens += static_cast<int64_t>(sample.tokens.size());
          std::vector<float> rr(sample.tokens.size(), 0.0f);
          rr.back() = static_cast<float>(r);
          rows.per_token["rewards"].push_back(std::move(rr));
          if (correct_off_policy)
            rows.per_token["rollout_logprobs"].emplace_back(sample.logprobs.begin(),
                                                            sample.logprobs.end());
          rows.prompts.push_back(ro.request.prompt);
          rows.responses.push_back(std::move(sample.tokens));
          rows.group_ids.push_back(static_cast<int64_t>(g));
        }
      }
      samples_trained += static_cast<int64_t>(n_rows);
      st.accuracy = correct / static_cast<double>(n_rows);
      res.rewards.push_back(st.reward);
      auto gap =
          examples::grpo::update_policy(or_die, client, rows, adam, use_kl, opt, st);
      auto t_sync = clock_type::now();
      auto updated = loop->update_weights();
      if (!updated && recover(updated.error(), step))
        updated = loop->version(); // the recovery synced the policy's new weights
      st.weight_version = or_die(std::move(updated), "weight update");
      st.sync_seconds = examples::seconds_since(t_sync);
      const auto engines_at_end = examples::grpo::read_engine_activity(engines.group());
      nlohmann::json extra{{"mode", opt.mode},
                           {"staleness_mean",
                            staleness_sum / static_cast<double>(batch.rollouts.size())},
                           {"staleness_max", staleness_max},
                           {"staleness_counts", staleness_counts},
                           {"dropped", batch.dropped},
                           {"requeued", batch.requeued},
                           {"samples", n_rows},
                           {"logprob_gap", gap.raw},
                           {"logprob_gap_corrected", gap.corrected},
                           {"tis_clipped", gap.tis_clipped}};
      extra.update(
          examples::grpo::step_activity(engines_at_start, engines_at_take, engines_at_end));
      if (!recoveries.empty()) {
        extra["recoveries"] = recoveries;
        recoveries = nlohmann::json::array();
      }
      if (opt.eval_every > 0 && (step % opt.eval_every == 0 || step == opt.steps)) {
        auto t_eval = clock_type::now();
        extra["held_out_accuracy"] = greedy_accuracy(or_die, client, task, held_out);
        eval_seconds += examples::seconds_since(t_eval);
      }
      extra["wall_seconds"] = examples::seconds_since(t_grpo) - eval_seconds;
      examples::grpo::finish_step(opt, st, metrics, extra);
      record_end[step] = metrics.tellp();
      if (opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0)
        checkpoint(step);
    } catch (const examples::deferred_failure& failure) {
      step = recover_trainer(failure, step); // the next step is the checkpoint's + 1
    }
  }
  if (!opt.quiet)
    std::printf("\n");
  res.grpo_seconds = examples::seconds_since(t_grpo) - eval_seconds;
  res.samples = samples_trained;
  if (auto acc = loop->accounting()) {
    res.staleness_counts = acc->staleness_counts;
    res.dropped = acc->dropped;
    res.requeued = acc->requeued;
  }

  // 4. Held-out accuracy after GRPO.
  res.acc_after = greedy_accuracy(or_die, client, task, held_out);
  return res;
}

} // namespace rlforge::examples::grpo
