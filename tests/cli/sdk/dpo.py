"""Issue 23, Tinker semantics found by the SDK's own paths: a DPO loss through the SDK's
forward_backward_custom. The SDK runs a forward pass, computes the custom loss on the returned
log-probs with torch, and sends cross_entropy with weights = -dLoss/dlogprob: negative on the
rejected completions. The server must accept them, report loss:sum = -sum(weights * logprobs),
and apply exactly the gradient of the DPO loss: a second model of the same seed, trained with
cross_entropy on weights computed here by hand from the DPO formula, ends bit-for-bit close."""

import math

import torch

from sdk_check import adam, check, datum, logprobs_of, result

BETA = 0.5
PROMPT = [1, 30, 31, 32]
# (chosen completion, rejected completion) per pair.
PAIRS = [([40, 41, 42], [50, 51]), ([60, 61], [70, 71, 72, 73])]


def pair_data():
    """Datums in order chosen0, rejected0, chosen1, rejected1, each with its completion mask."""
    data, masks = [], []
    for chosen, rejected in PAIRS:
        for completion in (chosen, rejected):
            tokens = PROMPT + completion
            mask = [0.0] * (len(PROMPT) - 1) + [1.0] * len(completion)
            data.append(datum(tokens[:-1], tokens[1:]))
            masks.append(mask)
    return data, masks


def dpo_margins(logprobs, reference, masks):
    """beta * ((chosen - ref) - (rejected - ref)) per pair, on per-position lists or tensors."""
    def seq(i, lp):
        return sum(m * x for m, x in zip(masks[i], lp))

    return [BETA * ((seq(2 * k, logprobs[2 * k]) - seq(2 * k, reference[2 * k]))
                    - (seq(2 * k + 1, logprobs[2 * k + 1]) - seq(2 * k + 1, reference[2 * k + 1])))
            for k in range(len(PAIRS))]


def body(c):
    service = c.service()
    custom = c.lora(service, seed=91)
    by_hand = c.lora(service, seed=91)
    data, masks = pair_data()
    # The same weights on both models: the reference log-probs of DPO.
    reference = [logprobs_of(result(custom.forward(data, "cross_entropy")), i)
                 for i in range(len(data))]
    hand_start = [logprobs_of(result(by_hand.forward(data, "cross_entropy")), i)
                  for i in range(len(data))]
    c.expect(hand_start == reference, "two models of seed 91 start with different log-probs")

    result(custom.forward_backward([datum(data[0].model_input.to_ints(),
                                          data[0].loss_fn_inputs["target_tokens"].data,
                                          masks[0])], "cross_entropy"))
    result(custom.optim_step(adam(5e-2)))  # move off the reference, so the margins are not 0
    result(by_hand.forward_backward([datum(data[0].model_input.to_ints(),
                                           data[0].loss_fn_inputs["target_tokens"].data,
                                           masks[0])], "cross_entropy"))
    result(by_hand.optim_step(adam(5e-2)))
    current = [logprobs_of(result(by_hand.forward(data, "cross_entropy")), i)
               for i in range(len(data))]

    def dpo_loss(_data, logprobs_list):
        margins = dpo_margins(logprobs_list, [torch.tensor(r) for r in reference],
                              [torch.tensor(m) for m in masks])
        loss = sum(-torch.nn.functional.logsigmoid(m) for m in margins)
        return loss, {"dpo_loss": float(loss)}

    fb = result(custom.forward_backward_custom(data, dpo_loss))

    # By hand: L = sum_k -log sigmoid(m_k); dL/dlogprob = -beta * sigmoid(-m_k) * mask on the
    # chosen completion and +beta * sigmoid(-m_k) * mask on the rejected one. The SDK sends
    # weights = -dL/dlogprob, so the server's loss:sum is -sum(weights * logprobs).
    margins = dpo_margins(current, reference, masks)
    expected_loss = sum(-math.log(1.0 / (1.0 + math.exp(-m))) for m in margins)
    c.note("dpo_loss", fb.metrics.get("dpo_loss"))
    c.expect(abs(fb.metrics.get("dpo_loss", float("nan")) - expected_loss) <= 1e-4,
             "the SDK's DPO loss %r, by hand %.6f" % (fb.metrics.get("dpo_loss"), expected_loss))
    weights = []
    for k, m in enumerate(margins):
        g = BETA / (1.0 + math.exp(m))  # beta * sigmoid(-m)
        weights.append([g * x for x in masks[2 * k]])
        weights.append([-g * x for x in masks[2 * k + 1]])
    c.expect(any(w < 0 for row in weights for w in row), "no negative weight in the DPO step")
    surrogate = -sum(w * lp for row_w, row_lp in zip(weights, current) for w, lp in zip(row_w, row_lp))
    got = fb.metrics.get("loss:sum", float("nan"))
    c.note("surrogate_loss_sum", got)
    c.expect(abs(got - surrogate) <= 1e-4 * max(1.0, abs(surrogate)),
             "forward_backward_custom loss:sum %.6f, by hand -sum(weights*logprobs) %.6f"
             % (got, surrogate))

    hand = [datum(d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].data, w)
            for d, w in zip(data, weights)]
    fb_hand = result(by_hand.forward_backward(hand, "cross_entropy"))
    c.expect(abs(fb_hand.metrics.get("loss:sum", float("nan")) - surrogate)
             <= 1e-4 * max(1.0, abs(surrogate)),
             "cross_entropy with the hand weights: loss:sum %r, expected %.6f"
             % (fb_hand.metrics.get("loss:sum"), surrogate))
    result(custom.optim_step(adam(5e-2)))
    result(by_hand.optim_step(adam(5e-2)))
    after_custom = [logprobs_of(result(custom.forward(data, "cross_entropy")), i)
                    for i in range(len(data))]
    after_hand = [logprobs_of(result(by_hand.forward(data, "cross_entropy")), i)
                  for i in range(len(data))]
    diff = max(abs(a - b) for x, y in zip(after_custom, after_hand) for a, b in zip(x, y))
    moved = max(abs(a - b) for x, y in zip(after_custom, current) for a, b in zip(x, y))
    c.note("custom_vs_hand_after_step", diff)
    c.note("moved_by_the_step", moved)
    c.expect(diff <= 1e-4, "after one DPO step the SDK's custom path and the hand weights differ "
             "by %.3g in log-probs" % diff)
    c.expect(moved > 10 * max(diff, 1e-6),
             "the DPO step moved the log-probs by only %.3g (custom vs hand %.3g)" % (moved, diff))


check("dpo").run(body)
