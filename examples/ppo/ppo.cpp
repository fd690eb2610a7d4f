// PPO through the dispatcher: a policy group (2 data-parallel ranks by default), a critic and
// a reference model learn a toy task with a programmatic reward: emit the target token. Each
// iteration samples responses with the backends' sampler from the current policy weights (read
// back from the policy's HF export until inference engines exist), scores them, computes old
// log-probs (policy), reference log-probs (ref) and values (critic) through the dispatcher, GAE
// advantages and returns, then trains the policy (PPO clip loss + KL to the reference) and the
// critic (clipped value loss). The program checks that the mean reward rose and exits non-zero
// otherwise.
//
//   ppo_example [--iterations 30] [--batch 32] [--ranks 2] [--lr 1e-2] [--seed 1]
//               [--metrics FILE] [--quiet]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/node.hpp"
#include "actors/placement_manager.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/algo/advantages.hpp"
#include "backends/algo/reductions.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/sampler.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/system_config.hpp"

#include "../common/driver.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
namespace fs = std::filesystem;

namespace {

constexpr int64_t vocab = 16;
constexpr int64_t target_token = 7; ///< the reward counts this token in the response
constexpr int64_t response_tokens = 4;

double reward_of(const std::vector<int64_t>& tokens) {
  double hits = 0;
  for (auto t : tokens)
    hits += t == target_token ? 1.0 : 0.0;
  return tokens.empty() ? 0.0 : hits / static_cast<double>(tokens.size());
}

/// Spawns a group of `role` with `ranks` ranks in its own placement group and registers it.
actor_group add_role(const examples::fatal_errors& or_die, placement_client& pgs,
                     const caf::actor& manager, trainer_client& client, const std::string& role,
                     int ranks) {
  auto group = examples::spawn_group(or_die, pgs, manager, role, role, ranks,
                                     {{"GPU", 0.3}, {"CPU", 0.5}}, "spawn group");
  or_die(client.register_group(role, group), "register");
  return group;
}

} // namespace

int main(int argc, char** argv) {
  examples::driver_options opt;
  opt.count = 30;
  opt.lr = 1e-2;
  if (!examples::parse_options(argc, argv, "ppo_example", "--iterations", opt,
                               {"PPO with policy, critic and reference groups sharing virtual "
                                "GPUs; prints the reward per iteration.",
                                "PPO iterations", "ppo_example --iterations 30 --batch 32 --quiet"}))
    return 2;
  const int iterations = opt.count;
  std::ofstream metrics;
  if (!opt.metrics.empty() && !examples::open_metrics(metrics, opt.metrics, "ppo_example"))
    return 2;
  runtime::system_config cfg;
  // virtual GPUs; policy, critic and ref share them at 0.3 each
  if (!examples::configure(cfg, opt.ranks, "ppo_example", opt.cluster, opt.tls, opt.log_level,
                           opt.log_format))
    return 2;
  register_worker_kinds();
  caf::actor_system sys{cfg};
  examples::fatal_errors or_die{"ppo_example", sys};
  return examples::run_driver(or_die, [&]() -> int {
    auto manager = examples::placement(or_die, sys, cfg);
    placement_client pgs{sys, manager};
    trainer_client client{sys, or_die.dispatcher(), 120s};

    auto policy = add_role(or_die, pgs, manager, client, "policy", opt.ranks);
    auto ref = add_role(or_die, pgs, manager, client, "ref", 1);
    auto critic = add_role(or_die, pgs, manager, client, "critic", 1);
    model_spec model;
    model.config_json = examples::llama_config(vocab).dump();
    model.seed = opt.seed;
    for (auto role : {"policy", "ref", "critic"})
      or_die(client.init_model(role, model), "init_model");
    algorithm_config pcfg;
    pcfg.use_kl_loss = true; // k3 to the reference, coef 0.001
    or_die(client.set_algorithm_config("policy", pcfg), "set_algorithm_config");

    auto export_dir = fs::temp_directory_path() / ("rlforge_ppo_" + std::to_string(::getpid()));
    std::mt19937_64 rng(opt.seed);
    std::uniform_int_distribution<int64_t> token(0, vocab - 1);
    be::adam_params policy_adam;
    policy_adam.learning_rate = opt.lr;
    policy_adam.grad_clip_norm = 1.0;
    be::adam_params critic_adam;
    critic_adam.learning_rate = opt.lr;
    critic_adam.grad_clip_norm = 1.0;
    std::printf("ppo: policy %d DP ranks, ref 1, critic 1; %d prompts x %lld tokens, reward = "
                "share of token %lld\n",
                opt.ranks, opt.batch, static_cast<long long>(response_tokens),
                static_cast<long long>(target_token));

    std::vector<double> rewards_per_iteration;
    for (int it = 0; it < iterations; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      // 1. Sample from the current policy weights.
      or_die(client.save_hf_model("policy", export_dir.string()), "save_hf_model");
      auto sampler = be::causal_lm::load(export_dir.string());
      std::vector<std::vector<int64_t>> prompts;
      std::vector<be::sampling_params> params;
      for (int i = 0; i < opt.batch; ++i) {
        prompts.push_back({token(rng), token(rng), token(rng)});
        be::sampling_params p;
        p.max_tokens = response_tokens;
        p.temperature = 1.0;
        p.seed = opt.seed * 1000003 + static_cast<uint64_t>(it * opt.batch + i);
        params.push_back(p);
      }
      auto samples = be::generate(*sampler, prompts, params);
      // 2. Rewards (outcome reward on the last response token).
      std::vector<std::vector<int64_t>> responses;
      be::per_token_values per_token;
      double mean_reward = 0;
      for (auto& s : samples) {
        responses.push_back(s.tokens);
        std::vector<float> r(s.tokens.size(), 0.0f), lp;
        r.back() = static_cast<float>(reward_of(s.tokens));
        mean_reward += r.back() / static_cast<double>(samples.size());
        for (auto x : s.logprobs)
          lp.push_back(static_cast<float>(x));
        per_token["rewards"].push_back(r);
        per_token["rollout_logprobs"].push_back(lp);
      }
      rewards_per_iteration.push_back(mean_reward);
      auto batch = be::from_sequences(prompts, responses, per_token);
      // 3. Old log-probs, reference log-probs and values through the dispatcher.
      auto old = or_die(client.forward("policy", batch), "policy forward");
      auto base = or_die(client.forward("ref", batch), "ref forward");
      auto values = or_die(client.forward("critic", batch), "critic forward");
      batch.tensors["action_log_probs"] = old.outputs.at("logprobs");
      batch.tensors["base_action_log_probs"] = base.outputs.at("logprobs");
      batch.tensors["values"] = values.outputs.at("values");
      // 4. GAE, then the token-mean reduction folded into the advantages.
      algo::advantage_inputs ain;
      ain.rewards = batch.get("rewards");
      ain.response_mask = batch.get("response_mask").to(at::kFloat);
      ain.values = batch.get("values");
      algo::advantage_config acfg;
      acfg.gamma = 1.0;
      acfg.lambd = 0.95;
      auto adv = algo::compute_advantages("gae", ain, acfg);
      batch.tensors["returns"] = adv.returns;
      batch.tensors["advantages"] =
          algo::scale_advantages(adv.advantages * ain.response_mask, batch.get("loss_mask"));
      // 5. Train the policy and the critic.
      auto pout =
          or_die(client.forward_backward("policy", batch, "regular"), "policy forward_backward");
      auto pstep = or_die(client.optim_step("policy", policy_adam), "policy optim_step");
      auto cres =
          or_die(client.forward_backward("critic", batch, "ppo_critic"), "critic forward_backward");
      or_die(client.optim_step("critic", critic_adam), "critic optim_step");
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (metrics.is_open())
        metrics << nlohmann::json{{"iteration", it},
                                  {"reward", mean_reward},
                                  {"policy_loss", pout.metric("loss:sum")},
                                  {"kl", pout.metric("kl:mean")},
                                  {"entropy", pout.metric("entropy:mean")},
                                  {"critic_loss", cres.metric("loss:sum")},
                                  {"grad_norm", pstep.grad_norm},
                                  {"seconds", secs}}
                       .dump()
                << "\n";
      if (!opt.quiet) {
        std::printf("\riteration %d/%d  reward %.3f  kl %.4f  entropy %.3f  critic loss %.4f  "
                    "%.2f s/it ",
                    it + 1, iterations, mean_reward, pout.metric("kl:mean"),
                    pout.metric("entropy:mean"), cres.metric("loss:sum"), secs);
        std::fflush(stdout);
      }
    }
    std::printf("\n");
    std::error_code ec;
    fs::remove_all(export_dir, ec);
    for (auto* g : {&policy, &ref, &critic})
      g->stop();
    examples::shutdown(client, manager);

    auto [first, last] = examples::first_last_means(rewards_per_iteration, 5);
    std::printf("ppo: mean reward %.3f -> %.3f\n", first, last);
    if (!(last >= first + 0.2)) {
      std::printf("ppo: FAILED: the reward did not rise (by at least 0.2)\n");
      return 1;
    }
    std::printf("ppo: ok: the reward rose\n");
    return 0;
  });
}
