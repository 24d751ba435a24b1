"""Where the host time of one eager call goes: cProfile over many back-to-back calls at tiny shapes.

    PYTHONPATH=. python benchmarks/profile_host.py [--calls 2000] [--out DIR]

For each call kind (ta.softmax, ta.attention prefill/decode per backend, ta.scaled_dot_product_attention,
and torch's op for the same job) it prints the host µs per call (perf_counter over the calls, one
synchronize at the end) and, for ours, the functions with the most own time (cProfile, whose own
overhead inflates the absolute figures: read it for the split, the µs column for the cost). The
`overhead` benchmark suite is the measurement; this is the profile behind it.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402
from tiled_attn import _plan  # noqa: E402


def _cases(device: torch.device):
    bf16 = torch.bfloat16
    x32 = torch.randn(4, 128, device=device)
    x16 = x32.to(bf16)
    q = torch.randn(1, 8, 128, 64, device=device, dtype=bf16)
    kq = torch.randn(1, 8, 128, 64, device=device, dtype=bf16)
    qd = torch.randn(1, 32, 1, 64, device=device, dtype=bf16)
    kd = torch.randn(1, 8, 256, 64, device=device, dtype=bf16)
    kvc = torch.randn(1, 256, 8, 64, device=device, dtype=bf16)
    kv4 = kvc.transpose(1, 2)
    kv_table = torch.randperm(4, device=device).view(1, 4).to(torch.int32)
    kvp = torch.empty(4, 64, 8, 64, device=device, dtype=bf16)
    kvp[kv_table.long()] = kvc.view(1, 4, 64, 8, 64)
    kv_lens = torch.full((1,), 256, dtype=torch.int32, device=device)
    cases = {
        "torch.softmax fp32": lambda: torch.softmax(x32, -1),
        "ta.softmax fp32": lambda: ta.softmax(x32),
        "ta.softmax bf16": lambda: ta.softmax(x16),
        "ta.softmax cuda": lambda: ta.softmax(x32, backend="cuda"),
        "F.sdpa prefill": lambda: F.scaled_dot_product_attention(q, kq, kq, is_causal=True),
        "ta.attention prefill": lambda: ta.attention(q, kq, kq, causal=True),
        "ta.attention prefill cuda": lambda: ta.attention(q, kq, kq, causal=True, backend="cuda"),
        "ta.sdpa prefill": lambda: ta.scaled_dot_product_attention(q, kq, kq, is_causal=True),
        "F.sdpa decode": lambda: F.scaled_dot_product_attention(qd, kd, kd, enable_gqa=True),
        "ta.attention decode": lambda: ta.attention(qd, kd, kd),
        "ta.attention decode cuda": lambda: ta.attention(qd, kd, kd, backend="cuda"),
        "ta.sdpa decode": lambda: ta.scaled_dot_product_attention(qd, kd, kd, enable_gqa=True),
        # A KV cache of 256 keys (B = 1, GQA 32/8): the cache API, contiguous and paged (64-key
        # pages, shuffled), against F.sdpa on the same keys: the same Python path for both
        # layouts, so an eager gap between them at host-bound shapes is host noise, not the API.
        "F.sdpa kvcache": lambda: F.scaled_dot_product_attention(qd, kv4, kv4, enable_gqa=True),
        "ta.attention_kvcache contiguous": lambda: ta.attention_kvcache(qd, kvc, kvc, kv_lens),
        "ta.attention_kvcache paged-64": lambda: ta.attention_kvcache(qd, kvp, kvp, kv_lens, block_table=kv_table),
        # A decode loop through a model of 16 layers: the key/value length grows by one every 16
        # calls, so one call in 16 makes a new plan (a new signature) and 15 reuse it.
        "F.sdpa decode growing": _growing(lambda q, k: F.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                                          qd, kd),
        "ta.sdpa decode growing": _growing(lambda q, k: ta.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                                           qd, kd),
        # A training call: forward and backward through autograd (the engine's cost is in both);
        # GQA 32/8 like a Llama layer. backend=None trains with the wgmma backward on an H100/H200.
        "F.sdpa train": _train(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                              enable_gqa=True), device),
        "ta.attention train": _train(lambda q, k, v: ta.attention(q, k, v, causal=True), device),
    }
    return cases


def _train(fn, device):
    """fn's forward and backward, q (1, 32, 128, 64) and k, v (1, 8, 128, 64) bf16 needing grad."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn((1, h, 128, 64), generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()
               for h in (32, 8, 8))
    go = torch.randn((1, 32, 128, 64), generator=gen, device=device, dtype=torch.bfloat16)

    def call():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(go)
    return call


def _growing(fn, q, k, layers: int = 16, steps: int = 256):
    """Calls of a 16-layer decode loop: the key/value length grows by one every `layers` calls (a
    new tensor each step, as torch.cat makes), so one call in 16 has a new signature. `steps`
    lengths, then they repeat: _us_per_call's warm-up pass compiles every kernel specialization the
    lengths need (a one-time JIT cost, not the per-step cost measured here), and `fresh` is called
    before each timed pass, so our plans are made anew in it (torch's own per-shape caches stay
    warm: this favours torch)."""
    keys = torch.randn(k.shape[0], k.shape[1], k.shape[2] + steps, k.shape[3], device=k.device, dtype=k.dtype)
    lengths = [keys[:, :, :k.shape[2] + i].contiguous() for i in range(steps)]
    state = {"i": 0}

    def call():
        i = state["i"]
        state["i"] = i + 1
        return fn(q, lengths[(i // layers) % steps])
    call.calls = layers * steps
    return call


def _us_per_call(fn, calls: int, device) -> float:
    calls = getattr(fn, "calls", calls)
    for _ in range(getattr(fn, "calls", 50)):
        fn()
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(5):
        _plan.clear_all()  # a growing case makes its plans anew in each pass; others: one miss
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def _primitives(device: torch.device) -> dict:
    """The pieces of one call, each timed alone (µs per call, perf_counter over back-to-back calls,
    few enough that the GPU's launch queue never fills): the output allocation, a data_ptr()
    read, and the compiled softmax kernel of a plan launched through Triton's C launcher with
    tensor arguments (the launcher calls data_ptr() and cuPointerGetAttribute per pointer) and
    with their addresses (ints: what triton/launch.py passes)."""
    softmax_mod = sys.modules["tiled_attn.softmax"]  # the package's `softmax` is the function
    x = torch.randn(4, 128, device=device, dtype=torch.bfloat16)
    ta.softmax(x)
    ta.softmax(x)
    from tiled_attn.triton.launch import Bound
    plan = next(p for p in softmax_mod._PLANS.values() if isinstance(p.run, Bound))
    bound = plan.run
    ready, grid, index = bound.launch.ready, bound.launch.grid, x.device.index
    out = torch.empty_like(x)
    stream = _plan.current_stream(index)
    head = (grid[0], grid[1], grid[2], stream, ready[1], ready[3], ready[4], None, None, ready[2], None, None, None)
    xp, op = x.data_ptr(), out.data_ptr()
    args = bound._args
    cases = {
        "torch.empty_strided (4x128 bf16)": lambda: torch.empty_strided((4, 128), (128, 1), dtype=torch.bfloat16,
                                                                         device=device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.new_empty(shape)": lambda: x.new_empty((4, 128)),
        "tensor.data_ptr()": x.data_ptr,
        "launcher, 2 tensor args": lambda: ready[0](*head, x, out, *args),
        "launcher, 2 int args": lambda: ready[0](*head, xp, op, *args),
        "Bound(x, out) (ints)": lambda: bound(x, out),
        "torch.softmax (4x128 bf16)": lambda: torch.softmax(x, -1),
        "ta.softmax (4x128 bf16)": lambda: ta.softmax(x),
    }
    return {name: _us_per_call(fn, 500, device) for name, fn in cases.items()}


def _train_pieces(device: torch.device) -> dict:
    """The pieces of the training case's backward (q (1, 32, 128, 64), k, v (1, 8, 128, 64) bf16,
    causal), each timed alone as in _primitives: the forward recording a graph (ours and F.sdpa's),
    our backward without the autograd engine (tiled_attn.attention._backward: the plan lookup, the
    gradients' allocations and the launches), and its launches one by one (the Triton delta and dQ
    store kernels, the wgmma kernel's binding); where a piece is not on this device, it says so."""
    attn = sys.modules["tiled_attn.attention"]  # the package's `attention` is the function
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn((1, h, 128, 64), generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()
               for h in (32, 8, 8))
    go = torch.randn((1, 32, 128, 64), generator=gen, device=device, dtype=torch.bfloat16)
    scale = 0.125
    with torch.no_grad():
        out, lse = ta.attention(q, k, v, causal=True, return_lse=True)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    cases = {
        "F.sdpa forward (grad)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        "ta.attention forward (grad)": lambda: ta.attention(q, k, v, causal=True),
        "ta backward, no engine": lambda: attn._backward(go, qd, kd, vd, out, lse, None, scale, True, 0, "cuda",
                                                         False),
        "torch.empty (1,32,128) f32": lambda: torch.empty((1, 32, 128), dtype=torch.float32, device=device),
    }
    try:
        from tiled_attn.cuda import _build
        from tiled_attn.triton.attention_backward import plan_delta, plan_dq_store
        ext = _build.load(device)
        ws = torch.empty((1, 32, 128), dtype=torch.float32, device=device)
        acc = torch.empty(32 * 128 * 64, dtype=torch.float32, device=device)
        dq, dk, dv = (torch.empty_like(t) for t in (qd, kd, vd))
        delta = plan_delta(out, go, False, False, zero_acc=True)
        store = plan_dq_store(dq, scale, False)
        stream = _plan.current_stream(device.index or 0)
        cases.update({
            "delta launch (Bound)": lambda: delta(out, go, lse, ws, acc),
            "dq store launch (Bound)": lambda: store(acc, dq),
            "wgmma binding": lambda: _build.call(ext.attention_bwd_sm90, qd, kd, vd, go, lse, ws, acc, dk, dv, scale,
                                                 True, 0, 128, 1, False, stream),
        })
    except Exception as err:  # noqa: BLE001 -- no extension here: the rest still says something
        print(f"train pieces: the wgmma pieces are unavailable ({type(err).__name__}: {err})")
    return {name: _us_per_call(fn, 500, device) for name, fn in cases.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--cases", default="", help="only the cases whose name holds one of these comma-separated words")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_host.py needs a CUDA device")
        return 2
    device = torch.device("cuda")
    report = ["==== primitives (us per call) ===="]
    report += [f"{name:34s} {us:8.2f} us/call" for name, us in _primitives(device).items()]
    report.append("")
    words = [w for w in args.cases.split(",") if w]
    if not words or "train" in words:
        report.append("==== the training case's pieces (us per call) ====")
        report += [f"{name:34s} {us:8.2f} us/call" for name, us in _train_pieces(device).items()]
        report.append("")
    for name, fn in _cases(device).items():
        if words and not any(w in name for w in words):
            continue
        try:
            us = _us_per_call(fn, args.calls, device)
        except Exception as err:  # noqa: BLE001 -- a backend missing here: say so, go on
            report.append(f"{name:28s}  unavailable ({type(err).__name__}: {str(err)[:100]})")
            continue
        report.append(f"{name:28s} {us:8.1f} us/call")
        if name.startswith("ta."):
            prof = cProfile.Profile()
            _plan.clear_all()
            prof.enable()
            for _ in range(getattr(fn, "calls", args.calls)):
                fn()
            prof.disable()
            torch.cuda.synchronize(device)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
            report.append(buf.getvalue())
    text = "\n".join(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_host.txt").write_text(text)
    print(text)
    print("==== host us per call (the first lines: primitives) ====")
    print("\n".join(line for line in report if "us/call" in line or "unavailable" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
