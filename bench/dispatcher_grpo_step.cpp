// GRPO iterations through the dispatcher on a model directory (the Qwen2.5-0.5B shape in
// docs/PERFORMANCE.md), with full fine-tuning or LoRA: one policy rank and one engine rank on a
// virtual 2-GPU node, each iteration generate (`--group` samples of a prompt) → forward_backward
// (importance sampling, group-relative advantages) → optim_step → save_weights_for_sampler.
// Prints one JSON object per iteration with the seconds of each phase, then the medians after
// the first iteration.
//
//   dispatcher_grpo_step --model DIR [--lora-rank 0] [--group 4] [--max-tokens 32]
//                        [--iterations 3] [--dtype bf16|fp32] [--threads 2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/engine.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/train/training_batch.hpp"
#include "bench/bench_util.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
namespace be = rlforge::backends;

namespace {

template <class T> T ok(caf::expected<T> x, const char* what) {
  if (!x) {
    std::fprintf(stderr, "dispatcher_grpo_step: %s: %s\n", what, to_string(x.error()).c_str());
    std::exit(1);
  }
  return std::move(*x);
}

actor_group spawn(caf::actor_system& sys, const std::string& name, const std::string& kind,
                  int device, int threads) {
  group_spec s;
  s.name = name;
  s.kind = kind;
  s.placement.name = name + "_pg";
  s.placement.strategy = "pack";
  s.placement.bundles.push_back({0, "node0", {device}, {{"GPU", 1.0}, {"CPU", 1.0}}});
  s.threads_per_rank = threads;
  s.collectives = kind != "engine";
  s.init_timeout = std::chrono::seconds(60);
  return ok(actor_group::spawn(sys, s), "spawn");
}

} // namespace

int main(int argc, char** argv) {
  std::string model, dtype = "bf16";
  int64_t lora_rank = 0, group = 4, max_tokens = 32;
  int iterations = 3, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--lora-rank") lora_rank = std::atoll(v.c_str());
    else if (a == "--group") group = std::atoll(v.c_str());
    else if (a == "--max-tokens") max_tokens = std::atoll(v.c_str());
    else if (a == "--iterations") iterations = std::atoi(v.c_str());
    else if (a == "--dtype") dtype = v;
    else if (a == "--threads") threads = std::atoi(v.c_str());
    else
      return bench::usage_error("dispatcher_grpo_step", "unknown flag '" + a + "'",
                                "--model DIR [--lora-rank R] [--group G] [--max-tokens N] "
                                "[--iterations K] [--dtype bf16|fp32] [--threads T]");
  }
  if (model.empty() || argc % 2 == 0 || group < 2 || max_tokens < 1 || iterations < 1)
    return bench::usage_error("dispatcher_grpo_step", "--model is required; every flag takes a "
                              "value; --group >= 2", "--model DIR [...]");
  register_worker_kinds();
  register_engine_kind();
  runtime::system_config cfg;
  if (auto err = cfg.parse_args({}))
    return 1;
  caf::actor_system sys{cfg};
  auto dispatcher = spawn_dispatcher(sys);
  trainer_client client(sys, dispatcher, std::chrono::minutes(30));
  auto policy = spawn(sys, "policy", "policy", 0, threads);
  auto engines = spawn(sys, "engines", "engine", 1, threads);
  model_spec spec;
  spec.hf_dir = model;
  spec.compute_dtype = dtype;
  spec.lora_rank = lora_rank;
  spec.learning_rate = 1e-5;
  ok(client.register_group("policy", policy), "register policy");
  ok(client.init_model("policy", spec), "init policy");
  ok(client.register_engines(engines), "register engines");
  model_spec engine_spec = spec;
  engine_spec.lora_rank = 0;
  ok(engines.call_all(engine_ops::init_model, std::chrono::minutes(10), engine_spec),
     "init engines");
  const std::vector<int64_t> prompt{1, 17, 42, 99, 7, 300, 12, 5};
  std::vector<nlohmann::json> rows;
  for (int it = 0; it < iterations; ++it) {
    nlohmann::json t;
    auto t0 = bench::clock_type::now();
    sample_request r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.temperature = 1.0;
    r.num_samples = group;
    r.has_seed = true;
    r.seed = static_cast<uint64_t>(it);
    auto out = ok(client.generate({r}), "generate");
    t["generate"] = bench::seconds_since(t0);
    std::vector<std::vector<int64_t>> prompts, responses;
    std::vector<double> rewards;
    double mean = 0;
    for (auto& o : out) {
      prompts.push_back(prompt);
      responses.push_back(o.tokens);
      double even = 0;
      for (auto x : o.tokens)
        even += x % 2 == 0;
      rewards.push_back(even / static_cast<double>(o.tokens.size()));
      mean += rewards.back() / static_cast<double>(out.size());
    }
    be::per_token_values per_token;
    for (size_t i = 0; i < out.size(); ++i) {
      per_token["advantages"].emplace_back(out[i].tokens.size(),
                                           static_cast<float>(rewards[i] - mean));
      per_token["action_log_probs"].emplace_back(out[i].logprobs.begin(), out[i].logprobs.end());
    }
    auto batch = be::from_sequences(prompts, responses, per_token);
    t0 = bench::clock_type::now();
    ok(client.forward_backward("policy", batch, "importance_sampling"), "forward_backward");
    t["forward_backward"] = bench::seconds_since(t0);
    t0 = bench::clock_type::now();
    be::adam_params adam;
    adam.learning_rate = 1e-5;
    ok(client.optim_step("policy", adam), "optim_step");
    t["optim_step"] = bench::seconds_since(t0);
    t0 = bench::clock_type::now();
    ok(client.save_weights_for_sampler(), "save_weights_for_sampler");
    t["sync"] = bench::seconds_since(t0);
    t["iteration"] = t["generate"].get<double>() + t["forward_backward"].get<double>() +
                     t["optim_step"].get<double>() + t["sync"].get<double>();
    t["iteration_index"] = it;
    std::printf("%s\n", t.dump().c_str());
    std::fflush(stdout);
    rows.push_back(t);
  }
  nlohmann::json summary{{"lora_rank", lora_rank}, {"group", group}, {"max_tokens", max_tokens},
                         {"dtype", dtype}};
  for (const char* k : {"generate", "forward_backward", "optim_step", "sync", "iteration"}) {
    std::vector<double> v;
    for (size_t i = rows.size() > 1 ? 1 : 0; i < rows.size(); ++i)
      v.push_back(rows[i][k].get<double>());
    summary[k] = bench::median(v);
  }
  std::printf("%s\n", nlohmann::json{{"summary", summary}}.dump().c_str());
  std::fflush(stdout);
  // The system waits for every actor when it ends: the ranks and the dispatcher stop first.
  engines.stop();
  policy.stop();
  caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
  return 0;
}
