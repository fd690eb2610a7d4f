#include "examples/grpo/env_job.hpp"

#include <chrono>
#include <cstdio>
#include <random>

#include "env/pool.hpp"
#include "examples/grpo/env_rollout.hpp"
#include "examples/grpo/policy_update.hpp"
#include "examples/grpo/report.hpp"

namespace rlforge::examples::grpo {

namespace {

namespace be = rlforge::backends;
using clock_type = std::chrono::steady_clock;


std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

} // namespace

env_job_result run_env_job(const fatal_errors& or_die, actors::trainer_client& client,
                           const options& opt, const prompt::chat_prompt& chat, int64_t context,
                           bool use_kl, std::ostream& metrics) {
  env::subprocess_options process;
  process.process.argv = opt.env_argv;
  process.call_timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.env_timeout * 1000));
  process.handshake_timeout = process.call_timeout;
  const size_t per_step = static_cast<size_t>(opt.prompts) * static_cast<size_t>(opt.group);
  env::environment_pool pool(env::subprocess_factory(process), per_step);
  const auto task = nlohmann::json::parse(opt.env_task);
  const auto stops = stop_ids(chat);
  rollout_options ro;
  ro.max_turns = opt.max_turns;
  ro.turn_tokens = opt.turn_tokens;
  ro.context = context;
  std::mt19937_64 rng(opt.seed * 0x2545F4914F6CDD1DULL + 29);

  env_job_result result;
  int64_t weight_version = 0; // the engines start on the model directory's weights
  be::adam_params adam;
  adam.grad_clip_norm = 1.0;
  for (int step = 1; step <= opt.steps; ++step) {
    adam.learning_rate = learning_rate(opt, step);
    report::step_stats st;
    st.step = step;
    st.total_steps = opt.steps;
    // GRPO groups: the same task and seed `group` times.
    std::vector<env::reset_request> requests;
    std::vector<int64_t> group_of;
    for (int p = 0; p < opt.prompts; ++p) {
      env::reset_request r;
      r.seed = static_cast<int64_t>(rng() >> 1);
      r.task = task;
      for (int g = 0; g < opt.group; ++g) {
        requests.push_back(r);
        group_of.push_back(p);
      }
    }
    turn_generator generate = [&](const std::vector<turn_request>& turns) {
      std::vector<rlforge::sample_request> batch;
      for (const auto& t : turns) {
        rlforge::sample_request r;
        r.prompt = t.prompt;
        r.max_tokens = t.max_tokens;
        r.temperature = opt.temperature;
        r.has_seed = true;
        r.seed = rng();
        r.stop_token_ids = stops;
        batch.push_back(std::move(r));
      }
      auto t0 = clock_type::now();
      auto outs = or_die(client.generate(batch), "generate");
      st.generate_seconds += seconds_since(t0);
      std::vector<std::vector<int64_t>> ids;
      for (auto& o : outs)
        ids.push_back(std::move(o.tokens));
      return ids;
    };
    const auto episodes = run_rollout(pool, requests, chat, generate, ro);

    grpo_rows rows;
    int64_t ran = 0, positive = 0, failed = 0, done = 0, stopped = 0, turns = 0;
    double reward_sum = 0;
    std::map<std::string, int64_t> step_errors;
    for (size_t i = 0; i < episodes.size(); ++i) {
      const auto& e = episodes[i];
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
      rows.group_ids.push_back(group_of[i]);
    }
    st.reward = ran > 0 ? reward_sum / static_cast<double>(ran) : 0.0;
    st.accuracy = ran > 0 ? static_cast<double>(positive) / static_cast<double>(ran) : 0.0;
    result.rewards.push_back(st.reward);
    result.episodes += static_cast<int64_t>(episodes.size());
    result.done += done;
    result.stopped += stopped;
    result.failed += failed;
    for (const auto& [message, count] : step_errors)
      result.errors[message] += count;

    const bool train = !rows.prompts.empty();
    if (train)
      update_policy(or_die, client, rows, adam, use_kl, opt, st);
    else
      st.weight_version = weight_version;
    nlohmann::json extra{
        {"episodes", episodes.size()},
        {"episodes_done", done},
        {"episodes_stopped", stopped},
        {"episodes_failed", failed},
        {"mean_turns", static_cast<double>(turns) / static_cast<double>(episodes.size())}};
    finish_step(or_die, client, opt, st, metrics, train, extra);
    weight_version = st.weight_version;
    if (!step_errors.empty()) {
      std::printf("\ngrpo: step %d: %lld of %zu episodes failed%s\n", step,
                  static_cast<long long>(failed), episodes.size(),
                  train ? "" : "; nothing to train on, the policy is unchanged");
      for (const auto& [message, count] : step_errors)
        std::printf("grpo:   %lld x %s\n", static_cast<long long>(count), message.c_str());
      std::fflush(stdout);
    }
  }
  if (!opt.quiet)
    std::printf("\n");
  return result;
}

} // namespace rlforge::examples::grpo
