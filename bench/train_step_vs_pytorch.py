#!/usr/bin/env python3
"""rlforge's training step against eager PyTorch's on this CPU, interleaved in one run: for each
round, shape and dtype, `build/bench/train_bench` (the ~10M and ~100M shapes) or
`build/bench/gpu/gpu_train_bench --device cpu` (the Qwen2.5-0.5B shape, with AdamW) and then
bench/peers/llama_train_step.py with the same shape, sequence, batch and threads. Prints each
median of medians and the ratio peer / rlforge (> 1: rlforge is faster) with the goal.

  bench/train_step_vs_pytorch.py [--build build] [--rounds 3] [--threads 2]
                                 [--shapes small,large,qwen2.5-0.5b] [--dtypes bf16,fp32]
                                 [--python /usr/bin/python3]

The peer needs PyTorch in --python (Debian: python3-torch; a bench dependency only).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOALS = {"bf16": 1.2, "fp32": 1.1}


def ours(build, shape, dtype, threads, steps):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    if shape == "qwen2.5-0.5b":
        cmd = [f"{build}/bench/gpu/gpu_train_bench", "--device", "cpu", "--preset", shape,
               "--batch", "1", "--seq", "512", "--steps", str(steps), "--dtype", dtype,
               "--chunk", "512"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])["seconds"]
    cmd = [f"{build}/bench/train_bench", "--threads", str(threads), "--only", shape,
           "--dtype", dtype, f"--steps-{shape}", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"median step ([0-9.]+) s", out).group(1))


def peer(python, shape, dtype, threads, steps):
    cmd = [python, f"{HERE}/peers/llama_train_step.py", "--shape", shape, "--dtype", dtype,
           "--steps", str(steps), "--threads", str(threads)]
    if shape == "qwen2.5-0.5b":
        cmd += ["--seq", "512", "--adamw"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shapes", default="small,large,qwen2.5-0.5b")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--python", default="/usr/bin/python3")
    a = p.parse_args()
    results = {}
    for r in range(a.rounds):
        for shape in a.shapes.split(","):
            steps = {"small": 5, "large": 3}.get(shape, 2)
            for dtype in a.dtypes.split(","):
                o = ours(a.build, shape, dtype, a.threads, steps)
                q = peer(a.python, shape, dtype, a.threads, steps)
                results.setdefault((shape, dtype), ([], []))
                results[(shape, dtype)][0].append(o)
                results[(shape, dtype)][1].append(q)
                print(f"round {r + 1}: {shape} {dtype}: rlforge {o:.3f} s, pytorch {q:.3f} s",
                      flush=True)
    print()
    for (shape, dtype), (o, q) in results.items():
        mo, mq = statistics.median(o), statistics.median(q)
        goal = GOALS[dtype]
        print(json.dumps({"shape": shape, "dtype": dtype, "rlforge_s": mo, "pytorch_s": mq,
                          "speedup": mq / mo, "goal": goal, "met": mq / mo >= goal}))


if __name__ == "__main__":
    sys.exit(main())
