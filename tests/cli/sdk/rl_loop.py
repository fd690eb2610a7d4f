"""RL loop as the Tinker cookbook runs it: save_weights_and_get_sampling_client -> sample with
logprobs -> datums with target_tokens, logprobs, advantages -> forward_backward with
importance_sampling, then with ppo (clip thresholds in loss_fn_config) -> optim_step."""

import math

from sdk_check import adam, check, datum, logprobs_of, prompt, result, sampling

ITERATIONS = 3
PROMPT = [1, 17, 42, 99]
GROUP = 4
MAX_TOKENS = 6
PPO_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def reward(tokens):
    # Any deterministic reward will do: the share of tokens in the lower half of the vocabulary.
    return sum(1.0 for t in tokens if t < 256) / max(1, len(tokens))


def rl_data(sequences, baseline=0.5):
    """The cookbook's datums; baseline None gives every advantage 0."""
    rewards = [reward(s.tokens) for s in sequences]
    # A fixed baseline: sum(advantages) != 0 makes the on-policy loss informative.
    data, advantages = [], []
    for s, r in zip(sequences, rewards):
        tokens = PROMPT + list(s.tokens)
        n = len(PROMPT) - 1
        adv = [0.0] * n + [0.0 if baseline is None else r - baseline] * len(s.tokens)
        data.append(datum(tokens[:-1], tokens[1:], logprobs=[0.0] * n + list(s.logprobs),
                          advantages=adv))
        advantages.append(adv)
    return data, advantages


def check_metrics(c, where, metrics):
    c.expect("loss:sum" in metrics, "%s: no loss:sum in metrics %s" % (where, sorted(metrics)))
    for key, value in metrics.items():
        c.expect(key.count(":") == 1, "%s: metric key %r is not name:reduction" % (where, key))
        c.expect(math.isfinite(value), "%s: metric %s = %r" % (where, key, value))


def body(c):
    tc = c.lora(c.service(), seed=21)
    is_losses, ppo_losses, on_policy_gap = [], [], []
    for it in range(ITERATIONS):
        sampler = tc.save_weights_and_get_sampling_client()
        out = result(sampler.sample(prompt(PROMPT), num_samples=GROUP,
                                    sampling_params=sampling(MAX_TOKENS, seed=100 + it)))
        seqs = out.sequences
        c.expect(len(seqs) == GROUP,
                 "iteration %d: %d sequences for num_samples=%d" % (it, len(seqs), GROUP))
        for s in seqs:
            c.expect(s.logprobs is not None and len(s.logprobs) == len(s.tokens) > 0,
                     "iteration %d: sequence of %d tokens with logprobs %r"
                     % (it, len(s.tokens), s.logprobs))
        data, advantages = rl_data(seqs)

        fb = result(tc.forward_backward(data, "importance_sampling"))
        check_metrics(c, "iteration %d importance_sampling" % it, fb.metrics)
        is_losses.append(fb.metrics.get("loss:sum"))
        # Sampled from the weights being trained: ratio 1, so the trainer's logprobs are the
        # sampler's and the loss is -sum(advantages).
        gap = 0.0
        for i, s in enumerate(seqs):
            lp = logprobs_of(fb, i)
            gap = max(gap, max(abs(a - b) for a, b in zip(lp[len(PROMPT) - 1:], s.logprobs)))
        on_policy_gap.append(gap)
        c.expect(gap <= 1e-4,
                 "iteration %d: trainer vs sampler logprobs differ by %.3g" % (it, gap))
        expected = -sum(sum(a) for a in advantages)
        got = fb.metrics.get("loss:sum", float("nan"))
        c.expect(abs(got - expected) <= 1e-3,
                 "iteration %d: importance_sampling loss:sum %.6f, expected -sum(advantages) %.6f"
                 % (it, got, expected))
        # The ratio metric averages over the sampled positions whatever the advantages: the same
        # datums with every advantage 0 report the same ratio, 1 on-policy.
        ratio = fb.metrics.get("importance_ratio:mean", float("nan"))
        flat, _ = rl_data(seqs, baseline=None)
        flat_ratio = result(tc.forward(flat, "importance_sampling")).metrics.get(
            "importance_ratio:mean", float("nan"))
        c.expect(abs(ratio - 1.0) <= 1e-3 and abs(flat_ratio - ratio) <= 1e-6,
                 "iteration %d: importance_ratio:mean %.6f, with all advantages 0 %.6f "
                 "(on-policy: both 1)" % (it, ratio, flat_ratio))
        result(tc.optim_step(adam(1e-2)))

        fb = result(tc.forward_backward(data, "ppo", loss_fn_config=PPO_CONFIG))
        check_metrics(c, "iteration %d ppo" % it, fb.metrics)
        ppo_losses.append(fb.metrics.get("loss:sum"))
        c.expect(len(fb.loss_fn_outputs) == len(data),
                 "iteration %d ppo: %d outputs for %d datums"
                 % (it, len(fb.loss_fn_outputs), len(data)))
        result(tc.optim_step(adam(1e-2)))
    c.note("importance_sampling_loss_sum", is_losses)
    c.note("ppo_loss_sum", ppo_losses)
    c.note("on_policy_max_logprob_gap", on_policy_gap)
    c.note("metric_keys", sorted(fb.metrics))


check("rl_loop").run(body)
