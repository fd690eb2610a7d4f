"""Issue 11 point 1, cross-talk: N LoRA models in two sessions, each trained on its own data, call
save_weights_and_get_sampling_client at the same instant and sample, for several rounds with an
optim_step between them. Every sample's logprobs must equal its own model's forward logprobs of
the same tokens (prompt + completion, targets = the completion) within 1e-5."""

import threading

from sdk_check import (adam, check, completion_datum, logprobs_of, max_abs_diff, prompt, result,
                       sampling, shifted)

MODELS = 4
ROUNDS = 5
SAMPLES = 4
MAX_TOKENS = 6
PROMPT = [1, 7, 11, 13]
PROBE = [shifted([1, 3, 5, 7, 9, 11, 13, 15], [1.0] * 7)]
TOLERANCE = 1e-5


def own_data(k):
    # Model k learns its own continuation, so the models' distributions move apart.
    base = 40 + 100 * k
    return [shifted([1, 7, 11, 13] + [base + 3 * i + row for i in range(4)], [0, 0, 1, 1, 1, 1, 1])
            for row in range(2)]


def body(c):
    services = [c.service(), c.service()]  # two sessions: cross-talk must not cross users either
    clients = [c.lora(services[k % 2], seed=41 + k) for k in range(MODELS)]
    barrier = threading.Barrier(MODELS, timeout=300)
    lock = threading.Lock()
    bad = [[] for _ in range(MODELS)]  # per model: (round, sample, max |diff|) over 1e-5
    worst = [0.0] * MODELS
    probes = {}  # (round, model) -> forward logprobs of PROBE
    errors = []

    def model_thread(k):
        tc = clients[k]
        try:
            for r in range(ROUNDS):
                result(tc.forward_backward(own_data(k), "cross_entropy"))
                result(tc.optim_step(adam(5e-2)))
                barrier.wait()  # all models save and sample at the same instant
                sampler = tc.save_weights_and_get_sampling_client()
                params = sampling(MAX_TOKENS, seed=1000 * r + k)
                out = result(sampler.sample(prompt(PROMPT), num_samples=SAMPLES,
                                            sampling_params=params))
                data = [completion_datum(PROMPT, s.tokens) for s in out.sequences]
                fwd = result(tc.forward(data + PROBE, "cross_entropy"))
                for j, s in enumerate(out.sequences):
                    own = logprobs_of(fwd, j)[len(PROMPT) - 1:]
                    diff = max_abs_diff(own, s.logprobs)
                    with lock:
                        worst[k] = max(worst[k], diff)
                        if diff > TOLERANCE:
                            bad[k].append((r, j, diff))
                with lock:
                    probes[(r, k)] = logprobs_of(fwd, len(data))
        except Exception as e:
            with lock:
                errors.append("model %d: %s: %s" % (k, type(e).__name__, e))
            barrier.abort()

    threads = [threading.Thread(target=model_thread, args=(k,)) for k in range(MODELS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        c.expect(False, e)

    total = MODELS * ROUNDS * SAMPLES
    wrong = sum(len(b) for b in bad)
    c.note("samples", total)
    c.note("samples_off_their_model", wrong)
    c.note("max_abs_logprob_diff_per_model", worst)
    for k in range(MODELS):
        c.expect(not bad[k], "model %d: %d of %d samples are not its own model's logprobs "
                 "(round, sample, max |diff|): %s"
                 % (k, len(bad[k]), ROUNDS * SAMPLES,
                    ", ".join("(%d, %d, %.3g)" % b for b in bad[k][:6])))
    # The check is only as sensitive as the models are different from each other.
    separation = []
    for r in range(ROUNDS):
        if all((r, k) in probes for k in range(MODELS)):
            separation.append(min(max_abs_diff(probes[(r, a)], probes[(r, b)])
                                  for a in range(MODELS) for b in range(a + 1, MODELS)))
    c.note("min_pairwise_model_diff_per_round", separation)
    c.expect(len(separation) == ROUNDS and min(separation) > 1e-2,
             "the models are not far enough apart to tell them apart: %s" % separation)


check("crosstalk").run(body)
