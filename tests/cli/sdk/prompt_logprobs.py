"""Issue 23, Tinker API parity: `sample(include_prompt_logprobs=True, topk_prompt_logprobs=k)`
and `compute_logprobs`, as SDK 0.25 exposes them, on the base model and on a trained LoRA
sampler. Position 0 is None in both lists; each later position holds k (token, log-prob) pairs,
most likely first; where the prompt's own token is among them its log-prob is the one
prompt_logprobs reports; with k = the vocabulary the pairs hold the whole distribution (its
probabilities sum to 1). compute_logprobs equals prompt_logprobs."""

import math

from sdk_check import adam, check, prompt, result, sampling, shifted

VOCAB = 512  # the tiny preset's vocabulary
PROMPT = [1, 30, 31, 32, 200, 7]


def check_sampler(c, label, sampler):
    for k in (4, VOCAB):
        out = result(sampler.sample(prompt(PROMPT), num_samples=1, sampling_params=sampling(2, 5),
                                    include_prompt_logprobs=True, topk_prompt_logprobs=k))
        plp, top = out.prompt_logprobs, out.topk_prompt_logprobs
        if not c.expect(plp is not None and top is not None,
                        "%s k=%d: prompt_logprobs %r, topk_prompt_logprobs %r"
                        % (label, k, plp is not None, top is not None)):
            continue
        c.expect(len(plp) == len(PROMPT) and len(top) == len(PROMPT),
                 "%s k=%d: %d prompt log-probs and %d top-k rows for a prompt of %d"
                 % (label, k, len(plp), len(top), len(PROMPT)))
        c.expect(plp[0] is None and top[0] is None,
                 "%s k=%d: position 0 is %r / %r, not None" % (label, k, plp[0], top[0]))
        for i in range(1, min(len(top), len(plp))):
            row = top[i] or []
            c.expect(len(row) == k, "%s k=%d: position %d has %d pairs" % (label, k, i, len(row)))
            lps = [lp for _, lp in row]
            c.expect(all(a >= b for a, b in zip(lps, lps[1:])),
                     "%s k=%d: position %d is not sorted: %s" % (label, k, i, lps[:6]))
            mine = [lp for t, lp in row if t == PROMPT[i]]
            if mine:
                c.expect(abs(mine[0] - plp[i]) <= 1e-5,
                         "%s k=%d: position %d: token %d has %.6f in the top-k, %.6f in "
                         "prompt_logprobs" % (label, k, i, PROMPT[i], mine[0], plp[i]))
            if k == VOCAB:
                mass = sum(math.exp(lp) for lp in lps)
                c.expect(abs(mass - 1.0) <= 1e-3,
                         "%s: position %d: the whole distribution sums to %.6f" % (label, i, mass))
                c.expect(bool(mine), "%s: position %d: token %d missing from the whole "
                         "distribution" % (label, i, PROMPT[i]))
        computed = result(sampler.compute_logprobs(prompt(PROMPT)))
        c.expect(computed[0] is None and all(abs(a - b) <= 1e-5
                                             for a, b in zip(computed[1:], plp[1:])),
                 "%s: compute_logprobs %s, prompt_logprobs %s" % (label, computed, plp))
        c.note("%s_top1_position1" % label, top[1][0] if top[1] else None)


def body(c):
    service = c.service()
    check_sampler(c, "base", service.create_sampling_client(base_model=c.args.base_model))
    tc = c.lora(service, seed=5)
    result(tc.forward_backward([shifted(PROMPT, [1.0] * (len(PROMPT) - 1))], "cross_entropy"))
    result(tc.optim_step(adam(5e-2)))
    check_sampler(c, "lora", tc.save_weights_and_get_sampling_client())
    # k beyond the vocabulary is refused naming the limit.
    try:
        result(service.create_sampling_client(base_model=c.args.base_model).sample(
            prompt(PROMPT), num_samples=1, sampling_params=sampling(1), topk_prompt_logprobs=513))
        c.expect(False, "topk_prompt_logprobs=513 was accepted")
    except Exception as e:  # the SDK raises its own error types
        c.expect("topk_prompt_logprobs" in str(e), "topk_prompt_logprobs=513 refused as: %s" % e)


check("prompt_logprobs").run(body)
