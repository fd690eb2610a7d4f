"""Shared plumbing of the SDK client checks (tests/cli/sdk/*.py) run by sdk_client_test.

Each check script is run as `python3 <script> --url http://127.0.0.1:PORT/ --base-model NAME`
with TINKER_API_KEY in the environment, against a fresh `rlforge serve` on a tiny random model.
It prints one summary line on stdout, `SDK-CHECK {json}`, with the check's name, `ok`, the list
of failed conditions (each naming the numbers it saw) and the numbers it measured, and exits 0
when every condition held, 1 when one failed, 2 when the client raised.
"""

import gc

gc.disable()  # the SDK's start-up can stall when gc closes a pooled socket (NOTES.md)

import argparse
import json
import math
import sys
import traceback

import tinker
from tinker import types

RESULT_TIMEOUT_S = 120  # every future; the test kills the whole script at its own deadline


class check:
    """Collects conditions and numbers; `run(body)` prints the summary and exits."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.numbers = {}
        parser = argparse.ArgumentParser()
        parser.add_argument("--url", required=True)
        parser.add_argument("--base-model", required=True)
        self.args = parser.parse_args()

    def expect(self, condition, what):
        """Records `what` (a sentence naming the numbers seen) when `condition` is false."""
        if not condition:
            self.failures.append(what)
        return bool(condition)

    def note(self, key, value):
        self.numbers[key] = value

    def service(self):
        return tinker.ServiceClient(base_url=self.args.url)

    def lora(self, service, seed, rank=4):
        # train_unembed=False: this suite checks LoRA on attention and MLP only.
        return service.create_lora_training_client(
            base_model=self.args.base_model, rank=rank, seed=seed, train_unembed=False
        )

    def run(self, body):
        code = 0
        try:
            body(self)
        except Exception as e:  # the client raised: report it as the check's result
            traceback.print_exc()
            self.failures.append("client raised %s: %s" % (type(e).__name__, e))
            code = 2
        ok = not self.failures
        if not ok and code == 0:
            code = 1
        summary = {"check": self.name, "ok": ok, "failures": self.failures, "numbers": self.numbers}
        sys.stdout.write("SDK-CHECK " + json.dumps(summary, sort_keys=True, default=float) + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
        # The SDK's background threads (heartbeats, event loop) must not keep the process alive.
        import os

        os._exit(code)


def result(future):
    return future.result(timeout=RESULT_TIMEOUT_S)


def datum(inputs, targets, weights=None, **floats):
    """A datum on `inputs` with `target_tokens` and float inputs (weights, logprobs, advantages)."""
    loss_fn_inputs = {
        "target_tokens": types.TensorData(data=list(targets), dtype="int64", shape=[len(targets)])
    }
    if weights is not None:
        floats["weights"] = weights
    for key, values in floats.items():
        loss_fn_inputs[key] = types.TensorData(
            data=[float(v) for v in values], dtype="float32", shape=[len(values)]
        )
    return types.Datum(model_input=types.ModelInput.from_ints(list(inputs)),
                       loss_fn_inputs=loss_fn_inputs)


def shifted(tokens, weights):
    """The usual next-token datum on `tokens`: inputs tokens[:-1], targets tokens[1:]."""
    return datum(tokens[:-1], tokens[1:], weights)


def completion_datum(prompt, completion):
    """prompt + completion as a next-token datum weighted on the completion only."""
    tokens = list(prompt) + list(completion)
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return shifted(tokens, weights)


def logprobs_of(output, i):
    return [float(x) for x in output.loss_fn_outputs[i]["logprobs"].tolist()]


def max_abs_diff(a, b):
    if len(a) != len(b):
        return math.inf
    return max((abs(float(x) - float(y)) for x, y in zip(a, b)), default=0.0)


def adam(lr):
    return types.AdamParams(learning_rate=lr)


def sampling(max_tokens, seed=None):
    # temperature 1 and no top-k/top-p: the sampler's distribution is the trainer's.
    return types.SamplingParams(max_tokens=max_tokens, seed=seed, temperature=1.0, top_k=-1,
                                top_p=1.0)


def prompt(tokens):
    return types.ModelInput.from_ints(list(tokens))
