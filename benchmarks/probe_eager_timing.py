"""Per-call eager timing of one decode call, as the harness takes it, and its distribution.

    PYTHONPATH=. python benchmarks/probe_eager_timing.py

Why: in the kvcache suite of 2026-11-26 (H200) a call whose kernel takes ~40 µs (CUDA-graph column)
read either ~48 or ~72 µs in the eager column (per-call CUDA events over back-to-back calls, the
median), for every provider alike, ta.attention's dense decode too: the eager ratios between
providers at such points moved by up to ±40% from run to run. This prints, for ta.attention decode
(B = 1, GQA 32/8, Nq = 4, Nk = 32768, D = 128, bf16) and F.scaled_dot_product_attention on the same
tensors: percentiles of 2000 per-call event timings, the same with Python's garbage collector off,
and the mean per call of 2000 back-to-back calls between two events (throughput, no per-call
events), so a bimodal distribution and its cause (GC, the events, the host) can be told apart.
"""
from __future__ import annotations

import gc
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402


def per_call(fn, n=2000):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in ev)


def throughput(fn, n=2000):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / n


def show(name, t):
    q = [t[int(p * (len(t) - 1))] for p in (0.05, 0.25, 0.5, 0.75, 0.95)]
    hist = {}
    for x in t:
        hist[int(x // 5) * 5] = hist.get(int(x // 5) * 5, 0) + 1
    top = sorted(hist.items(), key=lambda kv: -kv[1])[:4]
    print(f"{name:40s} p5/25/50/75/95 " + " ".join(f"{v:.1f}" for v in q) +
          f"  mean {statistics.mean(t):.1f}  modes(µs bin: calls) {sorted(top)}", flush=True)


def main() -> int:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, 32, 4, 128, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, 32768, 128, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    calls = {"ta.attention decode": lambda: ta.attention(q, k, v, causal=True),
             "F.sdpa (same tensors)": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
    for name, fn in calls.items():
        for rep in range(2):
            show(f"{name} events #{rep}", per_call(fn))
        gc.disable()
        show(f"{name} events, gc off", per_call(fn))
        gc.enable()
        print(f"{name:40s} throughput {throughput(fn):.1f} µs/call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
