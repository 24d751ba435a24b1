"""Sweep tile configs of the Triton attention backward on this GPU; print rows for configs.py.

    PYTHONPATH=. python benchmarks/tune_triton_attention_backward.py [--out FILE] [--jobs 12]

For D in {64, 128} and causal on/off (bf16, B·N = 16k tokens, H·D = 2048, N = 4096: the middle of
the `attention_backward` suite's grid), every candidate row of the dK/dV kernel is installed in
configs.TRITON_ATTENTION_BACKWARD under this GPU's arch and the whole backward (delta, dK/dV, dQ:
the launches that ship, through AttentionBackwardPlan) is timed with the dQ row fixed at the
table's; then the dQ candidates with the best dK/dV row (the kernels are independent, so the two
passes find the best pair); then the dK/dV rows of the atomic dQ mode (no dQ kernel). The summary
gives the best of each mode. A candidate's gradients must first match the shipped ones (a few bf16
ulps: garbage fails). Every candidate builds for sm_90a without register spills
(tests/test_attention_backward_sm90.py, -m slow).

Timing: triton.testing.do_bench (its L2 flush between calls), median ms; TFLOP/s counts the
backward as 2.5x the forward's 4·B·H·N²·D, halved when causal. Worker processes first run every
candidate once (--jobs), filling Triton's disk cache, so the timing pass only loads binaries.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tiled_attn as ta  # noqa: E402
from tiled_attn import configs  # noqa: E402
from tiled_attn.triton.attention import d_class  # noqa: E402

TOKENS, HIDDEN, N = 16384, 2048, 4096


def _row(bm, bn, w, s, band=True):
    row = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
    return row if band else dict(row, band=False)


# (BLOCK_M, BLOCK_N, warps, stages[, band]), each building for sm_90a with no register spill in both
# causal modes (ptxas; 2026-11-24, and 2026-11-26 for the "band": False rows). dK/dV keeps BLOCK_N
# keys on chip with two [BLOCK_N, D] float32 accumulators: 128 keys spill at 4 warps, 64x64 tiles
# spill at D >= 64, and with the causal band (a second copy of the loop) 32x128 spills at D = 128;
# "band": False walks causal keys in one loop that masks every step (attention_bwd_dkdv_kernel).
# 2026-11-26 (H200, benchmarks/results/2026-11-26-h200-tune-attention-backward.txt) also measured
# K, V (and Q, dO in dQ) held in registers instead of shared memory: slower at every row, dropped.
CANDIDATES = {
    ("dkdv", "d64"): [_row(16, 64, 4, 3), _row(16, 64, 4, 3, False), _row(32, 64, 4, 3, False), _row(16, 128, 8, 3),
                      _row(32, 128, 8, 3)],
    ("dkdv", "d128"): [_row(16, 128, 8, 3), _row(16, 64, 4, 3, False), _row(32, 128, 8, 2, False)],
    ("dq", "d64"): [_row(64, 64, 4, 3), _row(128, 64, 8, 3), _row(128, 32, 4, 4), _row(64, 32, 4, 4)],
    ("dq", "d128"): [_row(64, 32, 4, 3), _row(128, 32, 8, 3), _row(128, 64, 8, 2)],
}
# dK/dV rows of the atomic dQ mode (the kernel then also computes dS·K and adds it into dQ; the dQ
# kernel does not run).
ATOMIC = {
    "d64": [dict(_row(32, 128, 8, 3), dq="atomic"), dict(_row(16, 128, 8, 3), dq="atomic")],
    "d128": [dict(_row(16, 128, 8, 3), dq="atomic"), dict(_row(32, 64, 8, 2), dq="atomic")],
}
HEAD_DIMS = {"d64": 64, "d128": 128}


def all_candidates(atomic: bool = True):
    """(kernel, D, row) of every candidate (tests/test_attention_backward_sm90.py builds them);
    atomic=False leaves out the atomic dQ mode's."""
    return ([(k, HEAD_DIMS[dc], row) for (k, dc), rows in CANDIDATES.items() for row in rows]
            + [("dkdv", HEAD_DIMS[dc], row) for dc, rows in ATOMIC.items() for row in rows if atomic])


def install(kernel: str, d: int, row: dict, arch: str) -> None:
    configs.TRITON_ATTENTION_BACKWARD[(kernel, arch, "*", d_class(d))] = dict(row)


def inputs(d: int, causal: bool, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    b, h = TOKENS // N, HIDDEN // d
    q, k, v = (torch.randn(b, h, N, d, device=device, dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    out = ta.attention(q, k, v, causal=causal, backend="triton")
    dout = torch.randn(out.shape, device=device, dtype=out.dtype, generator=g)
    return q, k, v, out, dout


def backward(q, k, v, out, dout):
    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def tflops(d: int, causal: bool, ms: float) -> float:
    b, h = TOKENS // N, HIDDEN // d
    flops = 2.5 * 4.0 * b * h * N * N * d / (2 if causal else 1)
    return flops / ms / 1e9


def _warm(jobs_chunk):
    """Worker: run every (kernel row, d, causal) once, filling Triton's disk cache."""
    arch = configs.arch(torch.device("cuda"))
    for kernel, d, row, causal in jobs_chunk:
        install(kernel, d, row, arch)
        q, k, v, out, dout = inputs(d, causal, torch.device("cuda"))
        try:
            backward(q, k, v, out, dout)
        except Exception as e:  # noqa: BLE001 -- reported by the timing pass
            print(f"warm {kernel} {row} d={d} causal={causal}: {type(e).__name__}: {e}", flush=True)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--no-atomic", action="store_true", help="skip the atomic dQ mode's rows")
    args = ap.parse_args()
    from triton.testing import do_bench
    device = torch.device("cuda")
    arch = configs.arch(device)
    work = [(kernel, d, row, causal) for kernel, d, row in all_candidates(not args.no_atomic)
            for causal in (False, True)]
    if args.jobs > 1:
        ctx = mp.get_context("spawn")
        with ctx.Pool(args.jobs) as pool:
            pool.map(_warm, [work[i::args.jobs] for i in range(args.jobs)])
    lines, best = [], {}

    def sweep(label, d, causal, rows, fixed, kernel, q, k, v, out, dout, ref):
        """Time the backward with each row of `kernel` installed over `fixed`; (ms, row) best."""
        results = []
        for row in rows:
            for kk, r in fixed.items():
                install(kk, d, r, arch)
            install(kernel, d, row, arch)
            try:
                grads = backward(q, k, v, out, dout)
                bad = max(((g.float() - r).abs() / (1 + r.abs())).max().item() for g, r in zip(grads, ref))
                if not bad <= 2 ** -5:
                    raise AssertionError(f"gradients off by {bad:.3g}")
                ms = do_bench(lambda: backward(q, k, v, out, dout), warmup=10, rep=60)
            except Exception as e:  # noqa: BLE001
                lines.append(f"{label} {kernel} {row}: {type(e).__name__}: {str(e)[:200]}")
                print(lines[-1], flush=True)
                continue
            results.append((ms, row))
            lines.append(f"{label} {kernel} {row}: {ms:.3f} ms {tflops(d, causal, ms):.0f} TFLOP/s (backward)")
            print(lines[-1], flush=True)
        return min(results, key=lambda t: t[0]) if results else (float("inf"), None)

    for d in (64, 128):
        for causal in (False, True):
            label = f"D={d} causal={causal}"
            shipped = {kk: dict(configs.TRITON_ATTENTION_BACKWARD.get((kk, arch, "*", d_class(d)))
                                or configs.TRITON_ATTENTION_BACKWARD[(kk, "any", "*", d_class(d))])
                       for kk in ("dkdv", "dq")}
            shipped["dkdv"]["dq"] = "pass"
            q, k, v, out, dout = inputs(d, causal, device)
            ref = [g.float() for g in backward(q, k, v, out, dout)]
            # The dQ pass: the best dK/dV row with the shipped dQ row, then the best dQ row with it.
            ms, row = sweep(label, d, causal, CANDIDATES[("dkdv", d_class(d))], shipped, "dkdv",
                            q, k, v, out, dout, ref)
            if row is not None:
                shipped["dkdv"] = row
            ms_pass, dq_row = sweep(label, d, causal, CANDIDATES[("dq", d_class(d))], shipped, "dq",
                                    q, k, v, out, dout, ref)
            if dq_row is not None:
                shipped["dq"] = dq_row
            best[("pass", d, causal)] = (ms_pass, {"dkdv": shipped["dkdv"], "dq": shipped["dq"]})
            if not args.no_atomic:
                ms_atomic, atomic_row = sweep(label, d, causal, ATOMIC[d_class(d)], shipped, "dkdv",
                                              q, k, v, out, dout, ref)
                best[("atomic", d, causal)] = (ms_atomic, {"dkdv": atomic_row})
            for kk, r in shipped.items():
                install(kk, d, r, arch)
    lines.append("# best per (dQ mode, D, causal): ms, rows")
    for key, (ms, rows) in best.items():
        lines.append(f"# {key}: {ms:.3f} ms {tflops(key[1], key[2], ms):.0f} TFLOP/s {rows}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
