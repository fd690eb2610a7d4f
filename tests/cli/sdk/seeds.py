"""Issue 11 point 3, seeds: sample j of a request with seed S must not be sample j-1 of seed S+1
(each sample's stream comes from (seed, sample index), not seed + index); the same
(seed, num_samples) twice gives the same samples. On the base model and on a LoRA sampler."""

from sdk_check import adam, check, max_abs_diff, prompt, result, sampling, shifted

PROMPT = [1, 9, 18, 27]
SAMPLES = 4
MAX_TOKENS = 8
SEEDS = [1000, 1001, 1002]


def draw(sampler, seed):
    out = result(sampler.sample(prompt(PROMPT), num_samples=SAMPLES,
                                sampling_params=sampling(MAX_TOKENS, seed=seed)))
    return [(list(s.tokens), list(s.logprobs)) for s in out.sequences]


def same(a, b):
    """Two samples coincide: the same tokens, or the same logprobs (within 1e-6)."""
    return a[0] == b[0] or max_abs_diff(a[1], b[1]) <= 1e-6


def check_sampler(c, label, sampler):
    draws = {seed: draw(sampler, seed) for seed in SEEDS}
    overlaps = []
    for s in SEEDS[:-1]:
        for j in range(1, SAMPLES):
            a, b = draws[s][j], draws[s + 1][j - 1]
            if same(a, b):
                overlaps.append("seed %d sample %d = seed %d sample %d: tokens %s"
                                % (s, j, s + 1, j - 1, a[0]))
    c.note(label + "_overlapping_samples", len(overlaps))
    c.expect(not overlaps, "%s: %d of %d shifted sample pairs coincide: %s"
             % (label, len(overlaps), (len(SEEDS) - 1) * (SAMPLES - 1), "; ".join(overlaps[:3])))
    within = [(s, i, j) for s in SEEDS for i in range(SAMPLES) for j in range(i)
              if same(draws[s][i], draws[s][j])]
    c.expect(not within,
             "%s: identical samples within one request (seed, i, j): %s" % (label, within))
    again = draw(sampler, SEEDS[0])
    repeated = all(x[0] == y[0] and max_abs_diff(x[1], y[1]) <= 1e-6
                   for x, y in zip(again, draws[SEEDS[0]])) and len(again) == SAMPLES
    c.expect(repeated, "%s: seed %d twice gave different samples: %s then %s"
             % (label, SEEDS[0], [t for t, _ in draws[SEEDS[0]]], [t for t, _ in again]))


def body(c):
    service = c.service()
    check_sampler(c, "base", service.create_sampling_client(base_model=c.args.base_model))
    tc = c.lora(service, seed=61)
    result(tc.forward_backward([shifted([1, 9, 18, 27, 36, 45], [0, 0, 1, 1, 1])], "cross_entropy"))
    result(tc.optim_step(adam(1e-2)))
    check_sampler(c, "lora", tc.save_weights_and_get_sampling_client())


check("seeds").run(body)
