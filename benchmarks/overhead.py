"""The runner of the `overhead` suite (suite_overhead.py declares it). Host cost of one eager call (DESIGN §3, §6): µs per call at tiny shapes, ours against torch's op
for the same job, on the same tensors.

Tiny tensors, so the kernels take a few µs and back-to-back calls are bound by the host: the time
per call is the host's cost of a call. Method: after a warm-up, batches of `calls` back-to-back calls
timed with perf_counter and one synchronize per batch, ours and torch's batches interleaved (ABAB:
the host's clock and other tenants drift between batches on a shared machine), the median batch per
call. Each of ours is checked against torch's output first (a wrong one is FAILED, not timed).
Records: `value` = µs per call, `ratios` = torch's time / ours (> 1: ours cheaper).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import tiled_attn as ta

from . import harness as h
from .end_to_end import gpt_example


def _cases(device):
    """(label, ours: {name: fn}, torch's fn, tolerance) per case; fns take no argument."""
    bf16 = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype=bf16):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    x32, x16 = rnd(4, 128, dtype=torch.float32), rnd(4, 128)
    q, k = rnd(1, 8, 128, 64), rnd(1, 8, 128, 64)          # prefill: B=1, H=8, N=128, D=64, causal
    qd, kd = rnd(1, 32, 1, 64), rnd(1, 8, 256, 64)         # decode: 32/8 heads, Nk=256
    mod = ta.nn.Attention(512, 8, 2, rope_theta=10000.0, device=device, dtype=bf16).eval()
    # the same module with torch's SDPA as its attention step: examples/gpt.py's baseline
    base = gpt_example().TorchSDPAAttention(512, 8, 2, rope_theta=10000.0, device=device, dtype=bf16).eval()
    base.load_state_dict(mod.state_dict())
    xm = rnd(1, 64, 512)
    # A training call: forward and backward through autograd (the engine's own cost in both), GQA
    # 32/8 as a Llama layer; the returned output is what the check compares.
    qt, kt, vt = (rnd(1, h, 128, 64).requires_grad_() for h in (32, 8, 8))
    go = rnd(1, 32, 128, 64)
    backends = ("default", "triton", "cuda")

    def pinned(fn, backend):
        return fn if backend == "default" else (lambda: fn(backend))

    def train(fn):
        def step():
            qt.grad = kt.grad = vt.grad = None
            out = fn(qt, kt, vt)
            out.backward(go)
            return out.detach()
        return step

    cases = [
        ("softmax 4x128 fp32", {b: pinned(lambda be=None: ta.softmax(x32, -1, backend=be), b) for b in backends},
         lambda: torch.softmax(x32, -1), "torch.softmax"),
        ("softmax 4x128 bf16", {b: pinned(lambda be=None: ta.softmax(x16, -1, backend=be), b) for b in backends},
         lambda: torch.softmax(x16, -1), "torch.softmax"),
        ("attention prefill B=1 H=8 N=128 D=64 causal bf16",
         {b: pinned(lambda be=None: ta.attention(q, k, k, causal=True, backend=be), b) for b in backends},
         lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True), "F.sdpa"),
        ("attention decode B=1 Hq=32 Hkv=8 Nk=256 D=64 bf16",
         {b: pinned(lambda be=None: ta.attention(qd, kd, kd, backend=be), b) for b in backends},
         lambda: F.scaled_dot_product_attention(qd, kd, kd, enable_gqa=True), "F.sdpa"),
        ("ta.scaled_dot_product_attention prefill", {"default": lambda: ta.scaled_dot_product_attention(q, k, k, is_causal=True)},
         lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True), "F.sdpa"),
        ("ta.scaled_dot_product_attention decode",
         {"default": lambda: ta.scaled_dot_product_attention(qd, kd, kd, enable_gqa=True)},
         lambda: F.scaled_dot_product_attention(qd, kd, kd, enable_gqa=True), "F.sdpa"),
        ("ta.nn.Attention(512, 8 heads, 2 kv) forward, x (1, 64, 512)", {"default": lambda: _no_grad(mod, xm)},
         lambda: _no_grad(base, xm), "same module on F.sdpa"),
        ("attention train (forward + backward) B=1 Hq=32 Hkv=8 N=128 D=64 causal bf16",
         {b: train(lambda q_, k_, v_, be=(None if b == "default" else b): ta.attention(q_, k_, v_, causal=True,
                                                                                       backend=be))
          for b in backends},
         train(lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True)),
         "F.sdpa"),
    ]
    return cases


def _no_grad(m, x):
    with torch.no_grad():
        return m(x)


def _interleaved(fns: dict, calls: int, rounds: int, device) -> dict:
    """µs per call of each fn: `rounds` rounds, each timing one batch of every fn in turn."""
    for fn in fns.values():
        for _ in range(max(20, calls // 10)):
            fn()
    torch.cuda.synchronize(device)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize(device)
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


class OverheadSuite:
    name = "overhead"
    title = "Host cost of one eager call (µs per call at tiny shapes; lower is better)"
    device = "cuda"

    def describe(self, quick: bool) -> str:
        return ("ta.softmax 4x128 fp32/bf16, ta.attention prefill (B=1 H=8 N=128 D=64 causal) and decode "
                "(Hq=32 Hkv=8 Nk=256) per backend, ta.scaled_dot_product_attention, ta.nn.Attention, a "
                "training call (forward + backward, Hq=32 Hkv=8 N=128 causal) per backend; each against "
                "torch's op on the same tensors")

    def run(self, cfg) -> dict:
        t0 = time.perf_counter()
        calls, rounds = (300, 5) if cfg.quick else (1000, 9)
        records = []
        for label, ours, theirs, tname in _cases(cfg.device):
            ref = theirs()
            fns = {}
            for name, fn in ours.items():
                provider = f"{name}"
                try:
                    out = fn()
                    torch.cuda.synchronize(cfg.device)
                except Exception as err:  # a backend that is not built here, say
                    records.append(dict(suite=self.name, label=label, provider=provider, role="ours",
                                        status=h.UNSUPPORTED, error=str(err)[:200]))
                    continue
                err = (out.float() - ref.float()).abs().max().item()
                if not err <= 0.05:  # tiny bf16 outputs: ours vs torch's, both rounded to bf16
                    records.append(dict(suite=self.name, label=label, provider=provider, role="ours",
                                        status=h.FAILED, error=f"max |ours - torch| = {err:.3g}"))
                    continue
                fns[provider] = fn
            fns[tname] = theirs
            us = _interleaved(fns, calls, rounds, cfg.device)
            for name, v in us.items():
                role = "baseline" if name == tname else "ours"
                rec = dict(suite=self.name, label=label, provider=name, role=role, status=h.OK,
                           ms=v / 1e3, value=v, pct_ceiling=None, timing="host perf_counter, interleaved")
                if role == "ours":
                    rec["ratios"] = {tname: us[tname] / v}
                records.append(rec)
        return {"name": self.name, "title": self.title, "device": self.device, "unit": "µs/call",
                "ceiling": None, "convention": "host µs per eager call, back-to-back, tiny shapes",
                "notes": __doc__.split("\n\n")[1].replace("\n", " "), "baselines": [],
                "plot": {}, "elapsed_s": time.perf_counter() - t0, "capped": False,
                "device_lost": "", "records": records, "markdown": _markdown(records)}


def _markdown(records) -> list[str]:
    lines = ["| case | ours | µs/call | torch's op | µs/call | torch / ours |", "|---|---|---|---|---|---|"]
    base = {r["label"]: r for r in records if r.get("role") == "baseline"}
    for r in records:
        if r.get("role") != "ours":
            continue
        b = base.get(r["label"])
        if r["status"] != h.OK:
            lines.append(f"| {r['label']} | {r['provider']} | {r['status']}: {r.get('error', '')[:60]} | | | |")
            continue
        lines.append(f"| {r['label']} | {r['provider']} | {r['value']:.1f} | {b['provider']} | "
                     f"{b['value']:.1f} | {r['ratios'][b['provider']]:.2f}× |")
    return lines

