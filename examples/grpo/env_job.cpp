#include "examples/grpo/env_job.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>

#include <caf/all.hpp>

#include "backends/train/checkpoint.hpp"
#include "env/pool.hpp"
#include "examples/grpo/engine_reading.hpp"
#include "examples/grpo/env_rollout.hpp"
#include "examples/grpo/episode_json.hpp"
#include "examples/grpo/episode_producer.hpp"
#include "examples/grpo/policy_update.hpp"
#include "examples/grpo/report.hpp"
#include "examples/grpo/shared_engines.hpp"
#include "rl/rl_loop.hpp"

namespace rlforge::examples::grpo {

namespace {

namespace be = rlforge::backends;
using clock_type = std::chrono::steady_clock;

/// Tries of one turn's sampling: a turn whose call failed or that `pause(abort)` handed back is
/// sampled again, at most this many times in all (counted again after the engines are
/// replaced).
constexpr int turn_tries = 4;

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

/// Samples a group's turns on the engines from a worker thread: one request per turn, seeds
/// from the group's own generator (so a group's episodes do not depend on what else runs), each
/// sampled token's log-prob and version kept. Rows handed back unfinished ("abort") and calls
/// that fail are sampled again, after the engines are replaced when they were lost;
/// `resampled` counts those turns.
class turn_sampler {
public:
  turn_sampler(caf::actor_system& sys, actors::trainer_client& client, shared_engines& engines,
               const options& opt, std::vector<int64_t> stops, uint64_t seed,
               std::atomic<int64_t>& resampled)
      : sys_(sys), client_(client), engines_(engines), opt_(opt), stops_(std::move(stops)),
        rng_(seed), resampled_(resampled) {}

  std::vector<sampled_turn> operator()(const std::vector<turn_request>& turns) {
    std::vector<rlforge::sample_request> batch;
    for (const auto& t : turns) {
      rlforge::sample_request r;
      r.prompt = t.prompt;
      r.max_tokens = t.max_tokens;
      r.temperature = opt_.temperature;
      r.has_seed = true;
      r.seed = rng_();
      r.stop_token_ids = stops_;
      batch.push_back(std::move(r));
    }
    std::vector<sampled_turn> out(turns.size());
    std::vector<size_t> pending(turns.size()); // turns not sampled yet, by index
    for (size_t i = 0; i < pending.size(); ++i)
      pending[i] = i;
    std::string last_error;
    for (int attempt = 0; attempt < turn_tries && !pending.empty(); ++attempt) {
      if (!last_error.empty())
        resampled_ += static_cast<int64_t>(pending.size());
      std::vector<rlforge::sample_request> requests;
      for (auto i : pending)
        requests.push_back(batch[i]);
      const auto seen = engines_.generation();
      auto outs = client_.generate(requests);
      if (!outs) {
        last_error = sys_.render(outs.error());
        auto replaced = engines_.recover(client_, seen, last_error);
        if (!replaced)
          throw std::runtime_error(sys_.render(replaced.error()));
        if (*replaced)
          attempt = -1; // new engines: every try again
        continue;
      }
      std::vector<size_t> again;
      for (size_t k = 0; k < pending.size(); ++k) {
        auto& o = (*outs)[k];
        if (o.stop_reason == "abort") {
          again.push_back(pending[k]);
          last_error = "the engines handed the turn back";
          continue;
        }
        out[pending[k]] = sampled_turn{std::move(o.tokens), std::move(o.logprobs),
                                    std::move(o.token_versions)};
      }
      pending = std::move(again);
    }
    if (!pending.empty())
      throw std::runtime_error(std::to_string(pending.size()) + " turns failed " +
                               std::to_string(turn_tries) + " times; the last error: " +
                               last_error);
    return out;
  }

private:
  caf::actor_system& sys_;
  actors::trainer_client& client_;
  shared_engines& engines_;
  const options& opt_;
  std::vector<int64_t> stops_;
  std::mt19937_64 rng_;
  std::atomic<int64_t>& resampled_;
};

} // namespace

env_job_result run_env_job(const fatal_errors& or_die, actors::trainer_client& client,
                           engine_recovery& recovery, const options& opt,
                           const prompt::chat_prompt& chat, int64_t context, bool use_kl,
                           std::ostream& metrics) {
  rl::loop_options mode;
  rl::parse_rl_mode(opt.mode, mode.mode);
  mode.max_staleness = opt.max_staleness;
  const bool sync = mode.mode == rl::rl_mode::sync;
  const int64_t max_staleness = rl::effective_max_staleness(mode);
  // The groups held at each take: this step's and the batches the mode generates ahead, each on
  // a worker thread with `group` environments of its own.
  const auto groups_held = static_cast<size_t>((rl::batches_ahead(mode) + 1) * opt.prompts);

  env::subprocess_options process;
  process.process.argv = opt.env_argv;
  process.call_timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.env_timeout * 1000));
  process.handshake_timeout = process.call_timeout;
  env::environment_pool pool(env::subprocess_factory(process),
                             groups_held * static_cast<size_t>(opt.group));
  const auto task = nlohmann::json::parse(opt.env_task);
  const auto stops = stop_ids(chat);
  rollout_options ro;
  ro.max_turns = opt.max_turns;
  ro.turn_tokens = opt.turn_tokens;
  ro.context = context;
  std::mt19937_64 rng(opt.seed * 0x2545F4914F6CDD1DULL + 29);

  std::atomic<int64_t> resampled{0};
  shared_engines engines{recovery, or_die.sys, opt.max_restarts};
  auto engine_readings = [&engines] {
    auto now = engines.group();
    return read_engine_activity(now);
  };
  auto run_group = [&](const episode_group& g) {
    // A client per call: a trainer_client serves one thread at a time.
    actors::trainer_client own{or_die.sys, client.dispatcher(), std::chrono::seconds(300)};
    turn_sampler sample{or_die.sys, own,   engines, opt, stops,
                        static_cast<uint64_t>(*g.request.seed), resampled};
    return run_rollout(pool, std::vector<env::reset_request>(static_cast<size_t>(opt.group),
                                                             g.request),
                       chat, std::ref(sample), ro);
  };
  episode_producer producer(run_group, groups_held);
  int64_t next_id = 0;

  env_job_result result;
  int64_t weight_version = 0; // the engines start on the model directory's weights
  int first_step = 1;
  if (opt.resume) {
    // The policy (with its optimizer) from the latest checkpoint; the engines get it at the
    // checkpoint's weight version before any group runs again; then the groups: the finished
    // ones are trained on as if nothing happened, the unfinished ones run from their start.
    const auto step = or_die(client.load_checkpoint(opt.checkpoint_dir, -1, {"policy"}),
                             "load_checkpoint");
    producer_state groups;
    int64_t version = 0;
    try {
      const auto state = be::read_trainer_state(opt.checkpoint_dir, step).at("env");
      std::istringstream(state.at("rng").get<std::string>()) >> rng;
      next_id = state.at("next_id").get<int64_t>();
      version = state.at("weight_version").get<int64_t>();
      result.rewards = state.at("rewards").get<std::vector<double>>();
      groups = producer_state_from_json(state.at("groups"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "grpo: --resume: the checkpoint of step %lld in %s: %s\n",
                   static_cast<long long>(step), opt.checkpoint_dir.c_str(), e.what());
      throw fatal_exit{1};
    }
    weight_version = or_die(client.save_weights_for_sampler("policy", "", version),
                            "--resume: weight sync");
    std::printf("grpo: resumed at step %lld from %s: %zu groups run again, %zu finished kept; "
                "%lld taken and %lld dropped before; weight version %lld\n",
                static_cast<long long>(step), opt.checkpoint_dir.c_str(), groups.unfinished.size(),
                groups.finished.size(), static_cast<long long>(groups.totals.taken),
                static_cast<long long>(groups.totals.dropped),
                static_cast<long long>(weight_version));
    producer.restore(std::move(groups));
    first_step = static_cast<int>(step) + 1;
  }
  // A checkpoint: the policy's state, then (committed last) the groups held (finished ones
  // with their episodes, unfinished ones as their resets), the generator, the ids and version,
  // and the rewards so far.
  auto checkpoint = [&](int step) {
    std::ostringstream rng_text;
    rng_text << rng;
    nlohmann::json state{{"rng", rng_text.str()},
                         {"next_id", next_id},
                         {"weight_version", weight_version},
                         {"rewards", result.rewards},
                         {"groups", to_json(producer.state())}};
    or_die(client.save_checkpoint(opt.checkpoint_dir, step, {"policy"},
                                  nlohmann::json{{"env", state}}),
           "save_checkpoint");
  };
  be::adam_params adam;
  adam.grad_clip_norm = 1.0;
  const auto t_start = clock_type::now();
  for (int step = first_step; step <= opt.steps; ++step) {
    adam.learning_rate = learning_rate(opt, step);
    report::step_stats st;
    st.step = step;
    st.total_steps = opt.steps;
    // Top the groups up (drawn in id order from the job's generator): sync mode asks for each
    // step's groups just before the step.
    while (producer.held() < groups_held) {
      episode_group g;
      g.id = next_id++;
      g.request.seed = static_cast<int64_t>(rng() >> 1);
      g.request.task = task;
      producer.add(std::move(g));
    }
    const auto engines_at_start = engine_readings();
    // A replacement of lost engines synced the policy to them at a newer version.
    weight_version = std::max(weight_version, engines.synced_version());
    taken_groups taken;
    try {
      taken = producer.take(static_cast<size_t>(opt.prompts), weight_version, max_staleness,
                            std::chrono::minutes(10));
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "\ngrpo: step %d: episodes: %s\n", step, e.what());
      throw fatal_exit{1};
    }
    // Waiting for episodes is this step's generation time (all of it in sync mode).
    st.generate_seconds = taken.wait_seconds;
    const auto engines_at_take = engine_readings();

    grpo_rows rows;
    int64_t episodes = 0, ran = 0, positive = 0, failed = 0, done = 0, stopped = 0, turns = 0;
    double reward_sum = 0;
    std::map<std::string, int64_t> step_errors;
    std::vector<int64_t> staleness_counts;
    for (size_t g = 0; g < taken.groups.size(); ++g) {
      report::count_staleness(staleness_counts, taken.staleness[g]);
      for (const auto& e : taken.groups[g].episodes) {
        ++episodes;
        turns += e.turns;
        if (e.error) {
          ++failed;
          ++step_errors[first_line(*e.error)];
          continue;
        }
        ++ran;
        done += e.done ? 1 : 0;
        stopped += e.stopped ? 1 : 0;
        reward_sum += e.reward;
        positive += e.reward > 0 ? 1 : 0;
        if (!e.trainable())
          continue;
        for (float s : e.sampled)
          st.tokens += s == 1.0f ? 1 : 0;
        std::vector<float> reward(e.response.size(), 0.0f);
        reward.back() = static_cast<float>(e.reward);
        rows.prompts.push_back(e.prompt);
        rows.responses.push_back(e.response);
        rows.per_token["rewards"].push_back(std::move(reward));
        rows.per_token["loss_mask"].push_back(e.sampled);
        if (!sync)
          rows.per_token["rollout_logprobs"].emplace_back(e.logprobs.begin(), e.logprobs.end());
        rows.group_ids.push_back(static_cast<int64_t>(g));
      }
    }
    st.reward = ran > 0 ? reward_sum / static_cast<double>(ran) : 0.0;
    st.accuracy = ran > 0 ? static_cast<double>(positive) / static_cast<double>(ran) : 0.0;
    result.rewards.push_back(st.reward);
    result.episodes += episodes;
    result.done += done;
    result.stopped += stopped;
    result.failed += failed;
    result.trained += static_cast<int64_t>(rows.prompts.size());
    for (const auto& [message, count] : step_errors)
      result.errors[message] += count;

    const bool train = !rows.prompts.empty();
    logprob_gap gap;
    st.weight_version = weight_version;
    if (train) {
      gap = update_policy(or_die, client, rows, adam, use_kl, opt, st);
      // In the asynchronous modes the engines keep generating: the new weights go to them
      // without draining (--pause). In sync mode nothing is in flight.
      const auto t_sync = clock_type::now();
      const auto seen = engines.generation();
      auto synced = client.save_weights_for_sampler("policy", sync ? "" : opt.pause);
      if (!synced) {
        // Lost engines: replaced (here or by an episode thread), then synced again.
        auto replaced = engines.recover(client, seen, or_die.sys.render(synced.error()));
        if (!replaced)
          synced = std::move(replaced.error());
        else if (*replaced)
          synced = client.save_weights_for_sampler("policy", sync ? "" : opt.pause);
      }
      st.weight_version = or_die(std::move(synced), "save_weights_for_sampler");
      st.sync_seconds = seconds_since(t_sync);
    }
    const auto engines_at_end = engine_readings();
    const int64_t resampled_now = resampled.exchange(0);
    result.resampled += resampled_now;
    nlohmann::json extra{
        {"mode", opt.mode},
        {"episodes", episodes},
        {"episodes_done", done},
        {"episodes_stopped", stopped},
        {"episodes_failed", failed},
        {"mean_turns", episodes > 0 ? static_cast<double>(turns) / static_cast<double>(episodes)
                                    : 0.0},
        {"samples", static_cast<int64_t>(rows.prompts.size())},
        {"staleness_counts", staleness_counts},
        {"dropped", taken.dropped},
        {"requeued", resampled_now},
        {"logprob_gap", gap.raw},
        {"logprob_gap_corrected", gap.corrected},
        {"tis_clipped", gap.tis_clipped}};
    if (auto recoveries = engines.take_recoveries(); !recoveries.empty())
      extra["recoveries"] = std::move(recoveries);
    extra.update(step_activity(engines_at_start, engines_at_take, engines_at_end));
    extra["wall_seconds"] = seconds_since(t_start);
    finish_step(opt, st, metrics, extra);
    weight_version = st.weight_version;
    if (opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0)
      checkpoint(step);
    if (!step_errors.empty()) {
      std::printf("\ngrpo: step %d: %lld of %lld episodes failed%s\n", step,
                  static_cast<long long>(failed), static_cast<long long>(episodes),
                  train ? "" : "; nothing to train on, the policy is unchanged");
      for (const auto& [message, count] : step_errors)
        std::printf("grpo:   %lld x %s\n", static_cast<long long>(count), message.c_str());
      std::fflush(stdout);
    }
  }
  if (!opt.quiet)
    std::printf("\n");
  result.grpo_seconds = seconds_since(t_start);
  const auto acc = producer.accounting();
  result.staleness_counts = acc.staleness_counts;
  result.dropped = acc.dropped;
  return result;
}

} // namespace rlforge::examples::grpo
