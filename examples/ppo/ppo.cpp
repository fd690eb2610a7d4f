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

struct options {
  int iterations = 30;
  int batch = 32;
  int ranks = 2;
  double lr = 1e-2;
  uint64_t seed = 1;
  std::string metrics;
  bool quiet = false;
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ppo_example: %s needs a value\n", a.c_str());
        return nullptr;
      }
      return argv[++i];
    };
    auto positive = [&](int& out) {
      auto v = value();
      if (!v)
        return false;
      out = std::atoi(v);
      if (out < 1) {
        std::fprintf(stderr, "ppo_example: %s must be >= 1, got '%s'\n", a.c_str(), v);
        return false;
      }
      return true;
    };
    if (a == "--iterations") {
      if (!positive(o.iterations))
        return false;
    } else if (a == "--batch") {
      if (!positive(o.batch))
        return false;
    } else if (a == "--ranks") {
      if (!positive(o.ranks))
        return false;
    } else if (a == "--lr") {
      auto v = value();
      if (!v)
        return false;
      o.lr = std::atof(v);
      if (!(o.lr > 0) || !std::isfinite(o.lr)) {
        std::fprintf(stderr, "ppo_example: --lr must be > 0, got '%s'\n", v);
        return false;
      }
    } else if (a == "--seed") {
      auto v = value();
      if (!v)
        return false;
      o.seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--metrics") {
      auto v = value();
      if (!v)
        return false;
      o.metrics = v;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else {
      std::fprintf(stderr, "ppo_example: unknown argument '%s'\n", a.c_str());
      return false;
    }
  }
  return true;
}

std::string model_config_json() {
  nlohmann::json c{{"architectures", {"LlamaForCausalLM"}},
                   {"model_type", "llama"},
                   {"vocab_size", vocab},
                   {"hidden_size", 64},
                   {"intermediate_size", 128},
                   {"num_hidden_layers", 2},
                   {"num_attention_heads", 4},
                   {"num_key_value_heads", 2},
                   {"max_position_embeddings", 64},
                   {"rms_norm_eps", 1e-6},
                   {"tie_word_embeddings", false}};
  return c.dump();
}

template <class T>
T or_die(caf::actor_system& sys, caf::expected<T> x, const char* what) {
  if (!x) {
    std::fprintf(stderr, "\nppo_example: %s failed: %s\n", what, sys.render(x.error()).c_str());
    std::exit(1);
  }
  return std::move(*x);
}

void or_die(caf::actor_system& sys, caf::expected<void> x, const char* what) {
  if (!x) {
    std::fprintf(stderr, "\nppo_example: %s failed: %s\n", what, sys.render(x.error()).c_str());
    std::exit(1);
  }
}

double reward_of(const std::vector<int64_t>& tokens) {
  double hits = 0;
  for (auto t : tokens)
    hits += t == target_token ? 1.0 : 0.0;
  return tokens.empty() ? 0.0 : hits / static_cast<double>(tokens.size());
}

/// Spawns a group of `kind` with `ranks` ranks in its own placement group and registers it.
actor_group add_role(caf::actor_system& sys, placement_client& pgs, const caf::actor& manager,
                     trainer_client& client, const std::string& role, int ranks) {
  std::vector<resource_amounts> bundles(static_cast<size_t>(ranks),
                                        resource_amounts{{"GPU", 0.3}, {"CPU", 0.5}});
  auto pg = or_die(sys, pgs.create({role, bundles, "pack", 30}), "placement group");
  group_spec spec;
  spec.name = role;
  spec.kind = role;
  spec.placement = pg;
  spec.threads_per_rank = 1;
  spec.placement_manager = manager;
  auto group = or_die(sys, actor_group::spawn(sys, spec), "spawn group");
  or_die(sys, client.register_group(role, group), "register");
  return group;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  if (!parse(argc, argv, opt)) {
    std::fprintf(stderr, "usage: ppo_example [--iterations N] [--batch B] [--ranks R] [--lr X] "
                         "[--seed S] [--metrics FILE] [--quiet]\n");
    return 2;
  }
  std::ofstream metrics;
  if (!opt.metrics.empty()) {
    metrics.open(opt.metrics, std::ios::app);
    if (!metrics) {
      std::fprintf(stderr, "ppo_example: cannot open metrics file '%s'\n", opt.metrics.c_str());
      return 2;
    }
  }
  runtime::system_config cfg;
  cfg.gpus = opt.ranks; // virtual GPUs; policy, critic and ref share them at 0.3 each
  if (auto err = cfg.parse_args({})) {
    std::fprintf(stderr, "ppo_example: %s\n", caf::to_string(err).c_str());
    return 2;
  }
  register_worker_kinds();
  caf::actor_system sys{cfg};
  auto manager = spawn_placement_manager(sys, {local_node(cfg)}, 30s);
  placement_client pgs{sys, manager};
  trainer_client client{sys, spawn_dispatcher(sys), 120s};

  auto policy = add_role(sys, pgs, manager, client, "policy", opt.ranks);
  auto ref = add_role(sys, pgs, manager, client, "ref", 1);
  auto critic = add_role(sys, pgs, manager, client, "critic", 1);
  model_spec model;
  model.config_json = model_config_json();
  model.seed = opt.seed;
  for (auto role : {"policy", "ref", "critic"})
    or_die(sys, client.init_model(role, model), "init_model");
  algorithm_config pcfg;
  pcfg.use_kl_loss = true; // k3 to the reference, coef 0.001
  or_die(sys, client.set_algorithm_config("policy", pcfg), "set_algorithm_config");

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
  for (int it = 0; it < opt.iterations; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    // 1. Sample from the current policy weights.
    or_die(sys, client.save_hf_model("policy", export_dir.string()), "save_hf_model");
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
    auto old = or_die(sys, client.forward("policy", batch), "policy forward");
    auto base = or_die(sys, client.forward("ref", batch), "ref forward");
    auto values = or_die(sys, client.forward("critic", batch), "critic forward");
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
    auto pout = or_die(sys, client.forward_backward("policy", batch, "regular"),
                       "policy forward_backward");
    auto pstep = or_die(sys, client.optim_step("policy", policy_adam), "policy optim_step");
    auto cres = or_die(sys, client.forward_backward("critic", batch, "ppo_critic"),
                       "critic forward_backward");
    or_die(sys, client.optim_step("critic", critic_adam), "critic optim_step");
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
                  it + 1, opt.iterations, mean_reward, pout.metric("kl:mean"),
                  pout.metric("entropy:mean"), cres.metric("loss:sum"), secs);
      std::fflush(stdout);
    }
  }
  std::printf("\n");
  std::error_code ec;
  fs::remove_all(export_dir, ec);
  for (auto* g : {&policy, &ref, &critic})
    g->stop();
  caf::anon_send_exit(client.dispatcher(), caf::exit_reason::user_shutdown);
  caf::anon_send_exit(manager, caf::exit_reason::user_shutdown);

  size_t k = std::min<size_t>(5, rewards_per_iteration.size());
  double first = 0, last = 0;
  for (size_t i = 0; i < k; ++i) {
    first += rewards_per_iteration[i] / static_cast<double>(k);
    last += rewards_per_iteration[rewards_per_iteration.size() - 1 - i] / static_cast<double>(k);
  }
  std::printf("ppo: mean reward %.3f -> %.3f\n", first, last);
  if (!(last >= first + 0.2)) {
    std::printf("ppo: FAILED: the reward did not rise (by at least 0.2)\n");
    return 1;
  }
  std::printf("ppo: ok: the reward rose\n");
  return 0;
}
