#!/usr/bin/env python3
"""The PyTorch peers of rlforge's GPU benches, measured on the same GPU in the same call
(scripts/gpu-check runs this next to the C++ benches; docs/PERFORMANCE.md "GPU").

  pytorch_peer.py gemm              bf16 GEMM TFLOP/s (8192^3; the MFU denominator)
  pytorch_peer.py copy              device-to-device copy GB/s (the weight-sync limit)
  pytorch_peer.py train [--batch B --seq S --steps K]
                                    eager PyTorch training step of the Qwen2.5-0.5B shape:
                                    Hugging Face Qwen2ForCausalLM (random weights, SDPA
                                    attention), fp32 master weights under bf16 autocast, AdamW
  pytorch_peer.py decode [--batches 1,8,64,256 --prompt P --new N]
                                    greedy decode tokens/s of the same model in bf16
                                    (transformers' generate with its dynamic KV cache)

Each prints one JSON object per figure on stdout. FLOPs of a training step are counted as in
bench/train_bench.cpp: tokens x (6 x matmul parameters + 12 x layers x seq x hidden) - the
attention term without causal halving.
"""
import argparse
import json
import statistics
import sys
import time

import torch

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timed(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm(_):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    s = timed(lambda: torch.mm(a, b), reps=20, warmup=5)
    emit(figure="bf16_gemm", n=n, tflops=2 * n ** 3 / s / 1e12)


def copy(_):
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), reps=20, warmup=3)
    # Bytes moved once (what a weight transfer delivers), not read + written.
    emit(figure="d2d_copy", bytes=nbytes, gbps=nbytes / s / 1e9)


def qwen_model(dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**QWEN25_05B, attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device="cuda", dtype=dtype), cfg


def matmul_params(cfg):
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i
    return L * per_layer + h * cfg.vocab_size


def train(args):
    model, cfg = qwen_model(torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda", generator=gen)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    s = timed(step, reps=args.steps, warmup=3)
    tokens = args.batch * args.seq
    flops = tokens * (6 * matmul_params(cfg) + 12 * cfg.num_hidden_layers * args.seq * cfg.hidden_size)
    emit(figure="train_step", peer="pytorch eager + autocast bf16 (transformers Qwen2, sdpa)",
         torch=torch.__version__, batch=args.batch, seq=args.seq, seconds=s,
         tokens_per_s=tokens / s, tflops=flops / s / 1e12,
         peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30)


def decode(args):
    model, cfg = qwen_model(torch.bfloat16)
    model.eval()
    for b in [int(x) for x in args.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, args.prompt), device="cuda")
        mask = torch.ones_like(ids)

        def run():
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new,
                               min_new_tokens=args.new, do_sample=False, pad_token_id=0)

        s = timed(run, reps=3, warmup=1)
        emit(figure="decode", peer="pytorch eager bf16 (transformers generate)", batch=b,
             prompt=args.prompt, new_tokens=args.new, seconds=s, tokens_per_s=b * args.new / s)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("gemm")
    sub.add_parser("copy")
    t = sub.add_parser("train")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--steps", type=int, default=5)
    d = sub.add_parser("decode")
    d.add_argument("--batches", default="1,8,64,256")
    d.add_argument("--prompt", type=int, default=64)
    d.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pytorch_peer.py: no CUDA device")
    {"gemm": gemm, "copy": copy, "train": train, "decode": decode}[args.what](args)


if __name__ == "__main__":
    main()
