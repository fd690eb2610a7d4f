"""Supervised loop: cross_entropy forward_backward + optim_step on a LoRA model; the loss falls."""

from sdk_check import adam, check, logprobs_of, result, shifted

STEPS = 6
BATCH = [[1, 17, 42, 99, 100 + row, 200 + row, 2] for row in range(4)]
WEIGHTS = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def body(c):
    tc = c.lora(c.service(), seed=11)
    data = [shifted(tokens, WEIGHTS) for tokens in BATCH]
    losses = []
    for step in range(STEPS):
        out = result(tc.forward_backward(data, "cross_entropy"))
        c.expect("loss:sum" in out.metrics,
                 "step %d: no loss:sum in metrics %s" % (step, sorted(out.metrics)))
        loss = out.metrics.get("loss:sum", float("nan"))
        losses.append(loss)
        c.expect(len(out.loss_fn_outputs) == len(data),
                 "step %d: %d loss_fn_outputs for %d datums"
                 % (step, len(out.loss_fn_outputs), len(data)))
        # loss:sum of cross_entropy is -sum(weights * logprobs of the targets).
        expected = -sum(w * lp for i in range(len(data))
                        for w, lp in zip(WEIGHTS, logprobs_of(out, i)))
        c.expect(abs(loss - expected) <= 1e-4 * max(1.0, abs(expected)),
                 "step %d: loss:sum %.6f but -sum(weights*logprobs) = %.6f"
                 % (step, loss, expected))
        result(tc.optim_step(adam(5e-3)))
    c.note("loss_sum_per_step", losses)
    c.expect(losses[-1] < losses[0] - 0.5,
             "loss:sum did not fall: %s" % ", ".join("%.4f" % l for l in losses))


check("supervised").run(body)
