// Supervised fine-tuning through the dispatcher: a small Llama-style model learns to reverse a
// digit sequence ("3 1 4 |" -> "4 1 3 <eos>"), trained with the cross-entropy loss by a policy
// group of data-parallel ranks (2 by default; gradients are summed over the ranks with Gloo).
// A single-line progress bar shows the loss per token and the training throughput; every step
// is appended to a JSONL file. The program checks that the loss fell by at least half and exits
// non-zero otherwise.
//
//   sft_example [--steps 80] [--batch 32] [--ranks 2] [--lr 3e-3] [--seed 1]
//               [--metrics sft_metrics.jsonl] [--quiet]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/node.hpp"
#include "actors/placement_manager.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/system_config.hpp"

#include "../common/driver.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;

namespace {

// Token ids of the task: digits 0-9 are ids 1-10; then the separator, BOS and EOS.
constexpr int64_t sep_id = 11;
constexpr int64_t bos_id = 12;
constexpr int64_t eos_id = 13;

/// A 2-layer Llama with a 16-token vocabulary: big enough to learn the task in a few dozen steps.
std::string model_config_json() {
  auto c = examples::llama_config(16);
  c["bos_token_id"] = bos_id;
  c["eos_token_id"] = eos_id;
  return c.dump();
}

/// `batch` examples of 3-6 random digits: prompt "BOS d.. SEP", response "reversed d.. EOS".
be::training_batch make_batch(std::mt19937_64& rng, int batch, int64_t& tokens) {
  std::vector<std::vector<int64_t>> prompts, responses;
  std::uniform_int_distribution<int> len(3, 6), digit(0, 9);
  tokens = 0;
  for (int i = 0; i < batch; ++i) {
    std::vector<int64_t> digits(static_cast<size_t>(len(rng)));
    for (auto& d : digits)
      d = 1 + digit(rng);
    std::vector<int64_t> prompt{bos_id};
    prompt.insert(prompt.end(), digits.begin(), digits.end());
    prompt.push_back(sep_id);
    std::vector<int64_t> response(digits.rbegin(), digits.rend());
    response.push_back(eos_id);
    tokens += static_cast<int64_t>(prompt.size() + response.size());
    prompts.push_back(std::move(prompt));
    responses.push_back(std::move(response));
  }
  return be::from_sequences(prompts, responses);
}

void progress(int step, int steps, double loss, double tokens_per_s) {
  const int width = 30;
  int filled = steps > 0 ? width * step / steps : width;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::printf("\r[%s] step %d/%d  loss/token %.4f  %.0f tok/s ", bar.c_str(), step, steps, loss,
              tokens_per_s);
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  examples::driver_options opt;
  opt.count = 80;
  opt.lr = 3e-3;
  opt.metrics = "sft_metrics.jsonl";
  if (!examples::parse_options(argc, argv, "sft_example", "--steps", opt,
                               {"Supervised fine-tuning of a tiny Llama on a toy task across "
                                "--ranks data-parallel ranks; prints the loss per token.",
                                "training steps", "sft_example --steps 80 --batch 32 --quiet"}))
    return 2;
  const int steps = opt.count;
  std::ofstream metrics;
  if (!examples::open_metrics(metrics, opt.metrics, "sft_example"))
    return 2;
  runtime::system_config cfg;
  // Virtual GPUs: one per rank.
  if (!examples::configure(cfg, opt.ranks, "sft_example", opt.cluster, opt.tls, opt.log_level,
                           opt.log_format))
    return 2;
  register_worker_kinds();
  caf::actor_system sys{cfg};
  examples::fatal_errors or_die{"sft_example", sys};
  return examples::run_driver(or_die, [&]() -> int {
    auto manager = examples::placement(or_die, sys, cfg);
    placement_client pgs{sys, manager};
    auto group = examples::spawn_group(or_die, pgs, manager, "sft", "policy", opt.ranks,
                                       {{"GPU", 1}, {"CPU", 1}}, "spawn policy group");

    trainer_client client{sys, or_die.dispatcher(), 120s};
    or_die(client.register_group("policy", group), "register");
    model_spec model;
    model.config_json = model_config_json();
    model.seed = opt.seed;
    auto params = or_die(client.init_model("policy", model), "init_model");
    std::printf("sft: %lld parameters, %d DP ranks, batch %d, %d steps; metrics -> %s\n",
                static_cast<long long>(params), opt.ranks, opt.batch, steps, opt.metrics.c_str());

    std::mt19937_64 rng(opt.seed);
    be::adam_params adam;
    adam.learning_rate = opt.lr;
    adam.grad_clip_norm = 1.0;
    std::vector<double> losses;
    double tokens_total = 0, seconds_total = 0;
    for (int step = 0; step < steps; ++step) {
      int64_t tokens = 0;
      auto batch = make_batch(rng, opt.batch, tokens);
      auto t0 = std::chrono::steady_clock::now();
      auto out =
          or_die(client.forward_backward("policy", batch, "cross_entropy"), "forward_backward");
      auto res = or_die(client.optim_step("policy", adam), "optim_step");
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tokens_total += static_cast<double>(tokens);
      seconds_total += secs;
      double targets = batch.get("loss_mask").sum().item<double>();
      double loss = out.metric("loss:sum") / targets;
      losses.push_back(loss);
      double tps = static_cast<double>(tokens) / secs;
      metrics << nlohmann::json{{"step", step},
                                {"loss", loss},
                                {"loss_sum", out.metric("loss:sum")},
                                {"target_tokens", targets},
                                {"tokens", tokens},
                                {"tokens_per_s", tps},
                                {"grad_norm", res.grad_norm},
                                {"skipped", res.skipped},
                                {"lr", res.learning_rate}}
                     .dump()
              << "\n";
      if (!opt.quiet)
        progress(step + 1, steps, loss, tps);
    }
    std::printf("\n");
    metrics.flush();
    group.stop();
    examples::shutdown(client, manager);

    // First and last loss, each averaged over a few steps (single batches are noisy).
    auto [first, last] = examples::first_last_means(losses, 3);
    std::printf("sft: loss/token %.4f -> %.4f (%.1f%%), %.0f tokens/s overall\n", first, last,
                100.0 * last / first, tokens_total / seconds_total);
    if (!(last <= 0.5 * first)) {
      std::printf("sft: FAILED: the loss did not fall by at least half\n");
      return 1;
    }
    std::printf("sft: ok: the loss fell by at least half\n");
    return 0;
  });
}
