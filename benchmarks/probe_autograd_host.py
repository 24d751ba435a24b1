"""Host µs of one eager training call through autograd, by what the engine runs: a C++ node, an
identity torch.autograd.Function (the engine's cost of a Python node), F.sdpa, ta.attention, and
ta.attention's backward alone (no engine). Which thread runs a Python backward is printed too.
Then where a `.backward()` of ours spends its host time: the engine's start (from the call to our
backward's entry, on the engine's thread), our backward, and the engine's end (from our return to
`.backward()` returning), for ours and an identity Function, by `.backward` and `autograd.grad`;
whether the leaf's .grad is the tensor our backward returned (a stolen gradient) or a copy; and,
with --out, a torch.profiler table (and trace) of ours and of F.sdpa's `.backward`.

    PYTHONPATH=. python benchmarks/probe_autograd_host.py [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

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


def _phases(name, call, cls, calls=600) -> str:
    """Median host µs of call()'s pieces: start (call → cls.backward entered), inside, end (return →
    call returns), with the entry/exit times taken inside cls.backward on the engine's thread."""
    inner = cls.backward
    marks = {}

    def timed(ctx, *grads):
        marks["in"] = time.perf_counter()
        try:
            return inner(ctx, *grads)
        finally:
            marks["out"] = time.perf_counter()
    cls.backward = staticmethod(timed)
    rows = []
    try:
        for i in range(calls + 50):
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            if i >= 50:
                rows.append((marks["in"] - t0, marks["out"] - marks["in"], t1 - marks["out"], t1 - t0))
    finally:
        cls.backward = staticmethod(inner)
    med = [statistics.median(r[j] for r in rows) * 1e6 for j in range(4)]
    return (f"{name:44s} start {med[0]:7.1f}  inside {med[1]:7.1f}  end {med[2]:7.1f}  "
            f"total {med[3]:7.1f} us (the forward is in start)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write profiler tables and traces here")
    args = ap.parse_args(argv)
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

    def grad(fn, inputs=(q, k, v)):
        return lambda: torch.autograd.grad(fn(), inputs, go)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    ours = lambda: ta.attention(q, k, v, causal=True)  # noqa: E731
    # backend="cuda": the same backward, its own forward (backend=None's is Triton's): in the overhead
    # suite (session 25) "cuda" read 0.97x F.sdpa's training host time in three runs, None 0.88-1.00x.
    ours_cuda = lambda: ta.attention(q, k, v, causal=True, backend="cuda")  # noqa: E731
    cases = {
        "C++ node (q * 2) .backward": bwd(lambda: q * 2),
        "Python identity Function .backward": bwd(lambda: _Identity.apply(q)),
        "both, chained .backward": bwd(lambda: _Identity.apply(q * 2)),
        "F.sdpa forward (grad)": sdpa,
        "ta.attention forward (grad)": ours,
        "ta.attention forward (grad), backend=cuda": ours_cuda,
        "F.sdpa .backward": bwd(sdpa),
        "ta.attention .backward": bwd(ours),
        "ta.attention .backward, backend=cuda": bwd(ours_cuda),
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
    print(f"the wgmma backward's C++ path (attention_bwd_fast) registered: {attn._bwd_fast is not None}")

    # Where the engine's time goes around our node: its start, our backward, its end.
    fn_cls = attn._Attention
    print(_phases("ta.attention .backward", bwd(ours), fn_cls))
    print(_phases("ta.attention autograd.grad", grad(ours), fn_cls))
    print(_phases("identity Function .backward", bwd(lambda: _Identity.apply(q)), _Identity))
    print(_phases("identity Function autograd.grad", grad(lambda: _Identity.apply(q), (q,)), _Identity))
    # The engine's zeros for lse's unused gradient, as before set_materialize_grads(False).
    plain_fwd = fn_cls.forward

    def materialized(ctx, *a):
        res = plain_fwd(ctx, *a)
        ctx.set_materialize_grads(True)
        return res
    fn_cls.forward = staticmethod(materialized)
    try:
        print(_phases("ta.attention .backward, grads materialized", bwd(ours), fn_cls))
    finally:
        fn_cls.forward = staticmethod(plain_fwd)
    # A stolen gradient is the very tensor our backward returned; anything else was copied.
    got = {}
    inner = fn_cls.backward

    def keep(ctx, *grads):
        res = inner(ctx, *grads)
        got["ptrs"] = [t.data_ptr() if t is not None else None for t in res[:3]]
        return res
    fn_cls.backward = staticmethod(keep)
    try:
        bwd(ours)()
    finally:
        fn_cls.backward = staticmethod(inner)
    stolen = [t.grad.data_ptr() == p for t, p in zip((q, k, v), got["ptrs"])]
    print(f"q/k/v .grad is our backward's own tensor (stolen, not copied): {stolen}")
    print("strides: q", q.stride(), "q.grad", q.grad.stride(), "k", k.stride(), "k.grad", k.grad.stride())

    if args.out is not None:
        from torch.profiler import ProfilerActivity, profile
        args.out.mkdir(parents=True, exist_ok=True)
        for name, fn in (("ours", bwd(ours)), ("sdpa", bwd(sdpa)), ("ours-grad", grad(ours))):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(30):
                    fn()
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=45, max_name_column_width=60)
            (args.out / f"autograd-profile-{name}.txt").write_text(table)
            prof.export_chrome_trace(str(args.out / f"autograd-trace-{name}.json"))
            print(f"==== torch.profiler, 30 calls: {name} .backward ====")
            print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
