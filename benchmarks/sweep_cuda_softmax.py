"""Sweep launch configs of the CUDA softmax's fast rungs on this GPU; print the CUDA_SOFTMAX rows.

    PYTHONPATH=. python benchmarks/sweep_cuda_softmax.py --out $OUT/cuda_softmax_sweep [--dtype bf16]
        [--shapes 1179602x23,4050x1391] [--kernels flat_rows,warp_row]

Per (shape, dtype) of the softmax ladder (benchmarks/suite_softmax.py, or --shapes), each fast rung
that takes the row (warp_row, block_row_reg, block_row_smem, split_row, flat_rows) is timed with its "any" row of
configs.CUDA_SOFTMAX and with the candidates below, each installed as this arch's row of size
class exactly N and run through the public ta.softmax(x, -1, backend="cuda", kernel=...): what is
timed is what ships. A candidate must pass DESIGN §4 (harness.check_rule against float64) before it
is timed (harness.CudaTimer: CUDA graphs, inputs rotated through >= 2x L2). GB/s count one read +
one write, % of harness.measure_ceilings' copy, measured in the same run. torch.softmax and
backend=None ("default") are timed the same way on each shape, for the comparison.

Writes --out/sweep.json (every measurement) and sweep.md (the best per shape and rung, and the
rows to put in CUDA_SOFTMAX); applying them is a reviewed edit of configs.py, not automatic.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tiled_attn as ta  # noqa: E402
from benchmarks import harness as h  # noqa: E402
from benchmarks.suite_softmax import SHAPES  # noqa: E402
from tiled_attn import configs  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Candidates per rung (fields of a CUDA_SOFTMAX row). block_row_smem: CTA share of the row (bytes)
# decides the cluster size and CTAs per SM (228 KB of shared memory); split_row: columns per block
# and blocks per SM decide how many blocks stream at once and how much of x the second read finds
# in L2.
CANDIDATES = {
    "warp_row": [dict(threads=t) for t in (64, 128, 256, 512)],
    "block_row_reg": [dict(threads=t) for t in (128, 256, 512, 1024)],
    "block_row_smem": [dict(threads=t, cluster=1, cta_bytes=b)
                       for t, b in itertools.product((256, 512, 1024), (16384, 32768, 65536, 114688, 0))],
    "split_row": [dict(threads=t, chunk=c, min_chunk=4096, blocks_per_sm=b)
                  for t, c, b in itertools.product((256, 512), (16384, 32768, 65536, 131072), (2, 4, 8))],
    # flat_rows: the span a block stages (cta_bytes, 0 = 48 KB) against blocks an SM
    "flat_rows": [dict(threads=t, cta_bytes=b) for t, b in itertools.product((64, 128, 256), (4096, 8192, 16384, 0))],
}
# The lengths where a rung is, or could become, the default (CUDA_SOFTMAX "default" rows).
N_RANGE = {"warp_row": (1, 1024), "block_row_reg": (1024, 32768), "block_row_smem": (4096, 1 << 20),
           "split_row": (131072, 1 << 40), "flat_rows": (1, 2048)}


def run(args) -> dict:
    dev = torch.device("cuda")
    timer = h.CudaTimer(warmup_ms=3, rep_ms=15)
    ceil = h.measure_ceilings(dev, timer)
    arch = configs.arch(dev)
    records, t0 = [], time.time()
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        for shape in args.shapes or SHAPES:
            m, n = shape["M"], shape["N"]
            nbytes = 2 * m * n * dtype.itemsize
            sets = h.rotation_sets(m * n * dtype.itemsize, dev)
            g = torch.Generator(device="cpu").manual_seed(m * 7 + n)
            xs = [torch.randn(m, n, generator=g).to(dev, dtype) for _ in range(sets)]
            ref = torch.softmax(xs[0].double(), -1)
            e_torch = h.max_err(torch.softmax(xs[0], -1), ref)
            for name, fn in (("torch.softmax", lambda j: torch.softmax(xs[j % sets], -1)),
                             ("default", lambda j: ta.softmax(xs[j % sets], -1))):
                t = timer.measure(fn, sets)
                gbps = nbytes / (t.ms * 1e-3) / 1e9
                records.append(dict(M=m, N=n, dtype=dname, kernel=name, cfg="-", status="ok", ms=t.ms, gbps=gbps,
                                    pct=100 * gbps / ceil["copy_gbps"]))
            for kernel, cands in CANDIDATES.items():
                if args.kernels and kernel not in args.kernels:
                    continue
                lo, hi = N_RANGE[kernel]
                if not lo <= n <= hi:
                    continue
                for i, cand in enumerate([None] + cands):
                    if time.time() - t0 > args.budget:
                        print("budget spent", flush=True)
                        return dict(ceilings=ceil, records=records, cut=True)
                    key = (kernel, arch, dname, n)
                    saved = configs.CUDA_SOFTMAX.get(key)
                    if cand is not None:
                        configs.CUDA_SOFTMAX[key] = cand
                    rec = dict(M=m, N=n, dtype=dname, kernel=kernel, cfg=cand or "any")
                    try:
                        out = ta.softmax(xs[0], -1, backend="cuda", kernel=kernel)
                        chk = h.check_rule(out, ref, e_torch, dtype)
                        if not chk.ok:
                            rec.update(status="FAILED", message=chk.message)
                        else:
                            t = timer.measure(lambda j: ta.softmax(xs[j % sets], -1, backend="cuda",
                                                                   kernel=kernel), sets)
                            gbps = nbytes / (t.ms * 1e-3) / 1e9
                            rec.update(status="ok", ms=t.ms, gbps=gbps, pct=100 * gbps / ceil["copy_gbps"])
                    except (ValueError, RuntimeError) as e:
                        rec.update(status="unsupported", message=str(e)[:200])
                    finally:
                        if saved is None:
                            configs.CUDA_SOFTMAX.pop(key, None)
                        else:
                            configs.CUDA_SOFTMAX[key] = saved
                    records.append(rec)
                    if rec["status"] != "unsupported":
                        print(f"{m}x{n} {dname} {kernel} {rec['cfg']}: {rec['status']} "
                              f"{rec.get('pct', 0):.1f}%", flush=True)
            del xs, ref
            torch.cuda.empty_cache()
    return dict(ceilings=ceil, records=records, cut=False)


def report(res: dict) -> str:
    lines = [f"copy {res['ceilings']['copy_gbps']:.0f} GB/s" + ("; CUT by --budget" if res["cut"] else ""), "",
             "| shape | dtype | rung | 'any' row % copy | best % copy | best config |", "|---|---|---|---|---|---|"]
    best: dict = {}
    for r in res["records"]:
        if r["status"] != "ok":
            continue
        k = (r["M"], r["N"], r["dtype"], r["kernel"])
        b = best.setdefault(k, dict(any=None, top=None))
        if r["cfg"] == "any":
            b["any"] = r
        if b["top"] is None or r["pct"] > b["top"]["pct"]:
            b["top"] = r
    for (m, n, d, kern), b in best.items():
        anyp = f"{b['any']['pct']:.1f}" if b["any"] else "-"
        lines.append(f"| {m}x{n} | {d} | {kern} | {anyp} | {b['top']['pct']:.1f} | {b['top']['cfg']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="fp32,bf16")
    p.add_argument("--budget", type=float, default=240.0, help="seconds of timing")
    p.add_argument("--shapes", type=lambda s: [dict(M=int(a), N=int(b)) for a, b in (t.split("x") for t in s.split(","))],
                   default=None, help="MxN[,MxN...] instead of the ladder")
    p.add_argument("--kernels", type=lambda s: s.split(","), default=None, help="rungs to sweep (default: all)")
    args = p.parse_args()
    res = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(res, indent=1, default=str))
    md = report(res)
    (out / "sweep.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
