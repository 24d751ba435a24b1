"""Host µs of one eager training call through autograd, by what the engine runs: a C++ node, an
identity torch.autograd.Function (the engine's cost of a Python node), F.sdpa, ta.attention, and
ta.attention's backward alone (no engine). Which thread runs a Python backward is printed too.

    PYTHONPATH=. python benchmarks/probe_autograd_host.py
"""
from __future__ import annotations

import sys
import threading
import time

import torch
import torch.nn.functional as F

import tiled_attn as ta


class _Identity(torch.autograd.Function):
    thread = None

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        _Identity.thread = threading.get_ident()
        return g


def _us(fn, calls=2000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> int:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn((1, h, 128, 64), generator=gen, device=dev, dtype=torch.bfloat16).requires_grad_()
               for h in (32, 8, 8))
    go = torch.randn((1, 32, 128, 64), generator=gen, device=dev, dtype=torch.bfloat16)
    attn = sys.modules["tiled_attn.attention"]
    out, lse = ta.attention(q.detach(), k.detach(), v.detach(), causal=True, return_lse=True)

    def bwd(fn):
        def call():
            q.grad = k.grad = v.grad = None
            fn().backward(go)
        return call

    def grad(fn):
        return lambda: torch.autograd.grad(fn(), (q, k, v), go)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    ours = lambda: ta.attention(q, k, v, causal=True)  # noqa: E731
    cases = {
        "C++ node (q * 2) .backward": bwd(lambda: q * 2),
        "Python identity Function .backward": bwd(lambda: _Identity.apply(q)),
        "both, chained .backward": bwd(lambda: _Identity.apply(q * 2)),
        "F.sdpa forward (grad)": sdpa,
        "ta.attention forward (grad)": ours,
        "F.sdpa .backward": bwd(sdpa),
        "ta.attention .backward": bwd(ours),
        "F.sdpa autograd.grad": grad(sdpa),
        "ta.attention autograd.grad": grad(ours),
        "ta backward alone (no engine)": lambda: attn._backward(go, q.detach(), k.detach(), v.detach(), out, lse,
                                                                None, 0.125, True, 0, ("cuda"), False),
    }
    for name, fn in cases.items():
        print(f"{name:40s} {_us(fn):8.1f} us/call", flush=True)
    print(f"a Python backward ran on the main thread: {_Identity.thread == threading.get_ident()}")
    # Whether ours took the plan path in the engine (tiled_attn.attention._backward) or the op's.
    calls = {"op": 0}
    op = attn._attention_bwd_op

    def counted(*args):
        calls["op"] += 1
        return op(*args)
    attn._attention_bwd_op = counted
    for _ in range(10):
        bwd(ours)()
    attn._attention_bwd_op = op
    print(f"of 10 backward calls, {calls['op']} went through the torch.library op (not the plan path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
