#!/usr/bin/env python3
"""Times GRPO iterations through `rlforge serve` with the official Tinker SDK, as an RL loop
written against Tinker runs them: save_weights_and_get_sampling_client, sample `--group`
sequences of a prompt, forward_backward (importance_sampling with group-relative advantages),
optim_step. Prints one JSON object per iteration (the seconds of each phase) and one summary
line (medians after the first iteration). For the Qwen2.5-0.5B shape (docs/PERFORMANCE.md):

  build/cli/rlforge init-model --preset qwen2.5-0.5b --out /tmp/q05
  RLFORGE_API_KEY=k build/cli/rlforge serve --base-model /tmp/q05 --port 8123 ... &
  eval "$(../shared/tinker-sdk/env.sh)"; TINKER_API_KEY=k TINKER_TELEMETRY=0 \\
    /usr/bin/python3 bench/serve_grpo_step.py --url http://127.0.0.1:8123/ --base-model q05

Needs the official SDK (../shared/tinker-sdk: env.sh makes it importable).
"""
import gc

gc.disable()  # the SDK's start-up can stall when gc closes a pooled socket

import argparse
import json
import os
import statistics
import time

import tinker
from tinker import types


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--base-model", required=True)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--iterations", type=int, default=3)
    a = p.parse_args()
    prompt = [1, 17, 42, 99, 7, 300, 12, 5]
    service = tinker.ServiceClient(base_url=a.url)
    t0 = time.perf_counter()
    tc = service.create_lora_training_client(base_model=a.base_model, rank=a.rank, seed=1)
    setup = time.perf_counter() - t0
    rows = []
    for it in range(a.iterations):
        t = {}
        s = time.perf_counter()
        sampler = tc.save_weights_and_get_sampling_client()
        t["sync"] = time.perf_counter() - s
        s = time.perf_counter()
        params = types.SamplingParams(max_tokens=a.max_tokens, seed=it, temperature=1.0)
        out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=a.group,
                             sampling_params=params).result(timeout=1800)
        t["sample"] = time.perf_counter() - s
        rewards = [sum(1.0 for x in q.tokens if x % 2 == 0) / len(q.tokens) for q in out.sequences]
        mean = sum(rewards) / len(rewards)
        data = []
        for q, r in zip(out.sequences, rewards):
            tokens = prompt + list(q.tokens)
            n = len(prompt) - 1
            tensors = {
                "target_tokens": tokens[1:],
                "logprobs": [0.0] * n + list(q.logprobs),
                "advantages": [0.0] * n + [r - mean] * len(q.tokens),
            }
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={k: types.TensorData(data=v, dtype="int64" if k == "target_tokens"
                                                    else "float32", shape=[len(v)])
                                for k, v in tensors.items()}))
        s = time.perf_counter()
        tc.forward_backward(data, "importance_sampling").result(timeout=1800)
        t["forward_backward"] = time.perf_counter() - s
        s = time.perf_counter()
        tc.optim_step(types.AdamParams(learning_rate=1e-5)).result(timeout=1800)
        t["optim_step"] = time.perf_counter() - s
        t["iteration"] = sum(t.values())
        t["tokens"] = sum(len(q.tokens) for q in out.sequences)
        rows.append(t)
        print(json.dumps({"iteration": it, **t}), flush=True)
    later = rows[1:] or rows
    summary = {k: statistics.median(r[k] for r in later) for k in later[0]}
    print(json.dumps({"summary": summary, "setup_s": setup, "group": a.group,
                      "max_tokens": a.max_tokens, "rank": a.rank}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
