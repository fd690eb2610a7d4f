"""save_state / load_state / load_state_with_optimizer round trip: after a load, forward gives the
logprobs of save time (within 1e-6), and with the optimizer state training continues as it did
without the interruption (same losses, same final logprobs); so do clients created from the
state."""

from sdk_check import adam, check, logprobs_of, max_abs_diff, result, shifted

BATCH = [[1, 30 + row, 60 + row, 90 + row, 120 + row, 2] for row in range(3)]
WEIGHTS = [0.0, 1.0, 1.0, 1.0, 1.0]
PROBE = [shifted([1, 5, 9, 13, 17, 21, 25], [1.0] * 6)]
LR = 5e-3


def train(tc, steps):
    data = [shifted(tokens, WEIGHTS) for tokens in BATCH]
    losses = []
    for _ in range(steps):
        losses.append(result(tc.forward_backward(data, "cross_entropy")).metrics["loss:sum"])
        result(tc.optim_step(adam(LR)))
    return losses


def probe(tc):
    return logprobs_of(result(tc.forward(PROBE, "cross_entropy")), 0)


def body(c):
    service = c.service()
    tc = c.lora(service, seed=31)
    train(tc, 2)  # Adam's moments are non-zero at save time
    path = result(tc.save_state("mid")).path
    c.note("state_path", path)
    at_save = probe(tc)
    uninterrupted = train(tc, 3)
    final = probe(tc)
    c.expect(max_abs_diff(final, at_save) > 1e-3,
             "training after the save did not move the probe (%.3g): the round trip would be "
             "vacuous"
             % max_abs_diff(final, at_save))
    c.note("uninterrupted_losses", uninterrupted)

    def compare(label, client, with_optimizer):
        got = probe(client)
        diff = max_abs_diff(got, at_save)
        c.note(label + "_probe_diff", diff)
        c.expect(diff <= 1e-6, "%s: forward logprobs differ from save time by %.3g" % (label, diff))
        losses = train(client, 3)
        c.note(label + "_losses", losses)
        if with_optimizer:
            loss_diff = max_abs_diff(losses, uninterrupted)
            end_diff = max_abs_diff(probe(client), final)
            c.expect(loss_diff <= 1e-5 and end_diff <= 1e-5,
                     "%s: resumed training differs from the uninterrupted run: losses %s vs %s "
                     "(max diff %.3g), final logprobs max diff %.3g"
                     % (label, losses, uninterrupted, loss_diff, end_diff))
        else:
            # Fresh Adam moments: the first step is a different one, the losses differ.
            c.expect(max_abs_diff(losses[1:], uninterrupted[1:]) > 1e-6,
                     "%s: training without the optimizer state matched the resumed run %s: "
                     "were the moments loaded anyway?" % (label, losses))

    result(tc.load_state_with_optimizer(path))
    compare("load_state_with_optimizer", tc, True)
    result(tc.load_state(path))
    compare("load_state", tc, False)
    compare("from_state_with_optimizer",
            service.create_training_client_from_state_with_optimizer(path), True)
    compare("from_state", service.create_training_client_from_state(path), False)


check("state_roundtrip").run(body)
