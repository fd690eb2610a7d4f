#!/usr/bin/env python3
"""Eager PyTorch's training step on the CPU, the peer of bench/train_bench (same shapes, same
sequence length and batch, same loss): a Llama-style decoder written in plain PyTorch (RMSNorm,
rotary embeddings, grouped-query attention as Hugging Face's eager attention computes it,
SwiGLU), fp32 master weights, `torch.autocast("cpu", torch.bfloat16)` for bf16 or plain fp32,
loss = -mean log p(target), backward, optionally AdamW. What a user of a Python stack runs.

  llama_train_step.py --shape small|large|qwen2.5-0.5b [--dtype fp32|bf16] [--steps K] [--threads 2]
                      [--seq 256] [--batch B] [--adamw]

Prints one JSON object: the shape, the dtype, the median step seconds (after one warm-up) and
tokens/s. Needs PyTorch (Debian: python3-torch, a bench dependency, not a build one).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {  # vocab, hidden, layers, heads, kv heads, intermediate, batch, qkv bias, tied
    # as bench/train_bench.cpp's make_config
    "small": (4096, 384, 4, 6, 6, 1024, 8, False, False),
    "large": (16384, 768, 12, 12, 4, 2048, 1, False, False),
    # the "qwen2.5-0.5b" preset (Qwen2.5-0.5B's shape), as bench/gpu/train_step_bench.cpp runs it
    "qwen2.5-0.5b": (151936, 896, 24, 14, 2, 4864, 1, True, True),
}


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, h, heads, kv, inter, bias):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.q = torch.nn.Linear(h, heads * self.d, bias=bias)
        self.k = torch.nn.Linear(h, kv * self.d, bias=bias)
        self.v = torch.nn.Linear(h, kv * self.d, bias=bias)
        self.o = torch.nn.Linear(heads * self.d, h, bias=False)
        self.gate = torch.nn.Linear(h, inter, bias=False)
        self.up = torch.nn.Linear(h, inter, bias=False)
        self.down = torch.nn.Linear(inter, h, bias=False)
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.d).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / (self.d ** 0.5) + mask
        p = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(p, v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(torch.nn.Module):
    def __init__(self, vocab, h, layers, heads, kv, inter, bias, tied):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, h)
        self.layers = torch.nn.ModuleList(Layer(h, heads, kv, inter, bias) for _ in range(layers))
        self.norm = RMSNorm(h)
        self.head = torch.nn.Linear(h, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight
        self.d = h // heads

    def forward(self, ids):
        t = ids.shape[1]
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.d, 2).float() / self.d))
        f = torch.outer(torch.arange(t).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=SHAPES, required=True)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int)
    p.add_argument("--adamw", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    vocab, h, layers, heads, kv, inter, batch, bias, tied = SHAPES[a.shape]
    batch = a.batch or batch
    torch.manual_seed(1)
    model = Model(vocab, h, layers, heads, kv, inter, bias, tied)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95)) if a.adamw else None
    data = torch.randint(0, vocab, (batch, a.seq + 1))
    ids, targets = data[:, :-1], data[:, 1:]
    times = []
    for step in range(a.steps + 1):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, vocab), targets.reshape(-1))
        loss.backward()
        if opt:
            opt.step()
        if step > 0:
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(json.dumps({"figure": "train_step", "impl": "pytorch", "torch": torch.__version__,
                      "shape": a.shape, "dtype": a.dtype, "batch": batch, "seq": a.seq,
                      "threads": a.threads, "seconds": s, "tokens_per_s": batch * a.seq / s}))


if __name__ == "__main__":
    main()
