"""Issue 11 point 4, targets: a datum's target_tokens are what each position is scored on, not
necessarily the shifted inputs. A placeholder 0 at weight-0 prompt positions and a weighted
position whose target is not the next input are accepted, and the returned logprobs are the
log-probs of the given targets. Out-of-vocabulary ids are refused; negative ids with a 400/user
error naming the targets."""

import tinker

from sdk_check import adam, check, datum, logprobs_of, max_abs_diff, prompt, result, shifted

VOCAB = 512  # the tiny preset's vocabulary
TOKENS = [1, 12, 24, 36, 48, 60, 72, 84]  # prompt of 4, completion of 4
INPUTS = TOKENS[:-1]
WEIGHTS = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
OTHER = 5  # position whose target (400) is not the next input (72)
TARGETS = [0, 0, 0, 48, 60, 400, 84]
PLACEHOLDERS_ONLY = [0, 0, 0, 48, 60, 72, 84]
OTHER_ONLY = [12, 24, 36, 48, 60, 400, 84]


def refusal(tc, targets):
    """Submits a forward with `targets`; returns (refused, status or category, message)."""
    try:
        result(tc.forward([datum(INPUTS, targets, WEIGHTS)], "cross_entropy"))
        return False, None, "accepted"
    except tinker.APIStatusError as e:
        return True, "http %d" % e.status_code, str(e)
    except tinker.RequestFailedError as e:
        return True, "category %s" % e.category, e.message


def body(c):
    tc = c.lora(c.service(), seed=71)
    result(tc.forward_backward([shifted(TOKENS, [0, 0, 0, 1, 1, 1, 1])], "cross_entropy"))
    result(tc.optim_step(adam(2e-2)))  # away from the base model, so a wrong row would show
    sampler = tc.save_weights_and_get_sampling_client()

    given = None
    other = "target %d (not the next input %d) at weighted position %d" % (
        TARGETS[OTHER], INPUTS[OTHER + 1], OTHER)
    cases = [("placeholder 0 at the weight-0 positions", PLACEHOLDERS_ONLY),
             (other + ", the rest shifted", OTHER_ONLY),
             ("placeholders and " + other, TARGETS)]  # the last one is checked below
    for label, targets in cases:
        try:
            out = result(tc.forward([datum(INPUTS, targets, WEIGHTS)], "cross_entropy"))
            given = logprobs_of(out, 0)
        except Exception as e:
            c.expect(False, "forward with %s refused: %s: %s" % (label, type(e).__name__, e))
            given = None
    if given is not None:
        c.note("given_target_logprobs", given)
        usual = logprobs_of(result(tc.forward([shifted(TOKENS, WEIGHTS)], "cross_entropy")), 0)
        same = [t for t in range(len(INPUTS)) if WEIGHTS[t] > 0 and t != OTHER]
        diff = max_abs_diff([given[t] for t in same], [usual[t] for t in same])
        c.note("vs_shifted_targets_diff", diff)
        c.expect(diff <= 1e-6, "positions %s (targets = next inputs): logprobs differ from the "
                 "shifted datum's by %.3g" % (same, diff))
        # Every weighted position against the sampler's logprob of that target after that prefix.
        for t in range(len(INPUTS)):
            if WEIGHTS[t] == 0:
                continue
            ref = result(sampler.compute_logprobs(prompt(INPUTS[:t + 1] + [TARGETS[t]])))[-1]
            c.expect(abs(given[t] - ref) <= 1e-5,
                     "position %d: logprob of target %d is %.6f, compute_logprobs says %.6f"
                     % (t, TARGETS[t], given[t], ref))
        c.expect(abs(given[OTHER] - usual[OTHER]) > 1e-3,
                 "position %d: target %d scored like the next input %d (%.6f vs %.6f)"
                 % (OTHER, TARGETS[OTHER], INPUTS[OTHER + 1], given[OTHER], usual[OTHER]))
        fb = result(tc.forward_backward([datum(INPUTS, TARGETS, WEIGHTS)], "cross_entropy"))
        expected = -sum(w * lp for w, lp in zip(WEIGHTS, given))
        got = fb.metrics.get("loss:sum", float("nan"))
        c.expect(abs(got - expected) <= 1e-4 * max(1.0, abs(expected)),
                 "forward_backward loss:sum %.6f, expected -sum(weights*logprobs) %.6f"
                 % (got, expected))
        result(tc.optim_step(adam(2e-2)))

    for label, position, token in [("out-of-vocabulary weighted", OTHER, VOCAB),
                                   ("out-of-vocabulary weight-0", 1, 100000),
                                   ("negative", OTHER, -1)]:
        targets = list(TOKENS[1:])  # valid but for this one id
        targets[position] = token
        refused, how, message = refusal(tc, targets)
        c.note(label, "%s: %s" % (how, message[:300]))
        c.expect(refused, "%s target %d at position %d was accepted" % (label, token, position))
        if refused and label == "negative":
            c.expect(how == "http 400" or how == "category user",
                     "negative target refused as %s, not a 400/user error: %s"
                     % (how, message[:300]))
            c.expect("target" in message.lower(),
                     "negative target refused without naming the targets: %s" % message[:300])
    # The model still serves after the refusals.
    result(tc.forward([shifted(TOKENS, WEIGHTS)], "cross_entropy"))


check("targets").run(body)
