#include "examples/grpo/policy_update.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <ATen/ATen.h>

#include "backends/algo/advantages.hpp"
#include "backends/algo/reductions.hpp"

namespace rlforge::examples::grpo {

namespace {

namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
using clock_type = std::chrono::steady_clock;


} // namespace

caf::expected<void> configure_training(actors::trainer_client& client, const options& opt) {
  for (const char* role : {"policy", "ref"})
    if (auto done = client.set_algorithm_config(role, training_config(opt)); !done)
      return done;
  return caf::unit;
}

logprob_gap update_policy(const fatal_errors& or_die, actors::trainer_client& client,
                          const grpo_rows& rows, const be::adam_params& adam, bool use_kl,
                          const options& opt, report::step_stats& st) {
  auto t1 = clock_type::now();
  auto batch = be::from_sequences(rows.prompts, rows.responses, rows.per_token);
  algo::advantage_inputs ain;
  ain.rewards = batch.get("rewards");
  ain.response_mask = batch.get("response_mask").to(at::kFloat);
  ain.group_ids = rows.group_ids;
  auto adv = algo::compute_advantages("grpo", ain);
  batch.tensors["advantages"] =
      algo::scale_advantages(adv.advantages * ain.response_mask, batch.get("loss_mask"));
  // With one update per step the policy that is trained is the one whose log-probs are "old":
  // the loss takes them from its own pass (option old_logprobs = current) and the separate
  // forward, a third of a step's training, is skipped. More epochs need them fixed up front.
  const bool old_from_pass = opt.epochs == 1;
  algo::loss_config correction;
  if (old_from_pass) {
    correction.options["old_logprobs"] = "current";
  } else {
    auto old = or_die(client.forward("policy", batch), "policy forward");
    batch.tensors["action_log_probs"] = old.outputs.at("logprobs");
  }
  logprob_gap gap;
  const bool off_policy = batch.tensors.count("rollout_logprobs") > 0;
  const double cap = 2.0; // token TIS weights min(ρ, cap)
  if (off_policy && opt.tis != "none") {
    correction.options["tis_ratio_type"] = opt.tis;
    correction.values["token_tis_ratio_clip_high"] = cap;
  }
  // What the engines computed against what the trainer computes for the same tokens (the
  // trained ones: an episode's observations were not sampled).
  auto measure_gap = [&](const at::Tensor& trainer_logprobs) {
    const auto mask = batch.get("loss_mask").to(at::kFloat);
    const auto diff = (trainer_logprobs - batch.get("rollout_logprobs")) * mask;
    const double tokens = std::max(1.0, mask.sum().item<double>());
    gap.raw = diff.abs().sum().item<double>() / tokens;
    // The corrected engine log-prob matches the trainer's except where the weight was clipped.
    gap.corrected = (diff - diff.clamp_max(std::log(cap))).abs().sum().item<double>() / tokens;
  };
  if (off_policy && !old_from_pass)
    measure_gap(batch.get("action_log_probs"));
  if (use_kl) {
    auto base = or_die(client.forward("ref", batch), "ref forward");
    batch.tensors["base_action_log_probs"] = base.outputs.at("logprobs");
  }
  // --epochs PPO-clip updates on the same samples; the old log-probs stay those of the
  // policy that sampled, so from the second update on the clip bounds the step.
  for (int e = 0; e < opt.epochs; ++e) {
    auto out = or_die(client.forward_backward("policy", batch, "regular", correction),
                      "policy forward_backward");
    if (off_policy && old_from_pass)
      measure_gap(out.outputs.at("logprobs"));
    for (const char* key : {"tis_token_clip_high_ratio:mean", "tis_seq_clip_high_ratio:mean"})
      if (out.metrics.count(key))
        gap.tis_clipped += out.metrics.at(key) / opt.epochs;
    auto step_out = or_die(client.optim_step("policy", adam), "policy optim_step");
    st.loss += out.metric("loss:sum") / opt.epochs;
    st.kl += (use_kl ? out.metric("kl:mean") : 0.0) / opt.epochs;
    st.entropy += out.metric("entropy:mean") / opt.epochs;
    st.grad_norm = std::max(st.grad_norm, step_out.grad_norm);
  }
  st.train_seconds = seconds_since(t1);
  return gap;
}

void finish_step(const options& opt, const report::step_stats& st, std::ostream& metrics,
                 const nlohmann::json& extra) {
  auto record = report::to_json(st);
  for (const auto& [key, value] : extra.items())
    record[key] = value;
  metrics << record.dump() << "\n" << std::flush;
  if (!opt.quiet) {
    std::printf("\r%s ", report::progress_line(st).c_str());
    std::fflush(stdout);
  }
}

} // namespace rlforge::examples::grpo
