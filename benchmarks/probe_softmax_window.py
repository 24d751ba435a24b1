"""The Triton row softmax on rows that start off the 16-byte grid in three variants (VARIANTS: as
before, with update's exponentials kept (softmax_row.py KEEP_P), and with those and the window
reads (WIN)), beside torch.softmax and backend=None, side by side in one run: the A/B behind
KEEP_P and the configs' WINDOW (issue 16).

    PYTHONPATH=. python benchmarks/probe_softmax_window.py [--out FILE.json] [--rounds 3]

Shapes: the softmax suite's ladder and issue 16's random sweep and held-out sets
(harness.random_softmax_sets) where the row kernel takes the row (N <= 32768), fp32 / bf16 (--dtypes);
the window variant equals "keep" on rows that start on the 16-byte grid (N·size a multiple of 16).
Each point is checked against float64 under DESIGN §4's rule (a wrong provider is not timed), then
timed eager (the harness's CudaTimer: per-call CUDA events, inputs rotating through >= 2x L2, the
graph column beside) in `rounds` interleaved rounds (old, keep, window, torch, default, old, ...);
the table prints the medians as GB/s (one read + one write) and % of the copy bandwidth measured in
the same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402
from benchmarks import harness as h  # noqa: E402
from benchmarks.suite_softmax import SHAPES  # noqa: E402
from tiled_attn.triton import softmax as ts  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROW_MAX_N = 32768


def shapes() -> list[dict]:
    sweep, heldout = h.random_softmax_sets()
    ladder = [dict(M=s["M"], N=s["N"]) for s in SHAPES]
    return [dict(s, set=name) for name, group in (("ladder", ladder), ("sweep", sweep), ("heldout", heldout))
            for s in group if s["N"] <= ROW_MAX_N]


# name -> (softmax.WINDOW, softmax.KEEP_P) while planning: the row kernel before this probe's
# changes ("old": a second exponential per element, no windows), with update's exponentials kept,
# and with those and the window reads.
VARIANTS = {"old": (False, False), "keep": (False, True), "window": (True, True)}


def plan(x: torch.Tensor, out: torch.Tensor, window: bool, keep: bool):
    """The row kernel's plan with the switches set (they matter only while planning)."""
    saved = ts.WINDOW, ts.KEEP_P
    ts.WINDOW, ts.KEEP_P = window, keep
    try:
        return ts.plan_forward(x, out, "row")
    finally:
        ts.WINDOW, ts.KEEP_P = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="fp32,bf16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer = h.CudaTimer(eager_first=True)
    copy_gbps = h.measure_ceilings(dev, timer)["copy_gbps"]
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    rows = []
    for dt in args.dtypes.split(","):
        dtype = DTYPES[dt]
        esize = torch.empty((), dtype=dtype).element_size()
        for s in shapes():
            m, n = s["M"], s["N"]
            if m < 4:
                continue
            nbytes = 2 * m * n * esize
            sets = h.rotation_sets(m * n * esize * 2, dev)
            g = torch.Generator(device=dev).manual_seed(m * 7 + n)
            xs = [torch.randn((m, n), device=dev, dtype=dtype, generator=g) * 3 for _ in range(sets)]
            outs = [torch.empty_like(xs[0]) for _ in range(sets)]
            plans = {name: plan(xs[0], outs[0], *v) for name, v in VARIANTS.items()}

            def run(fn):
                def call(i):
                    fn(xs[i % sets], outs[i % sets])
                    return outs[i % sets]
                return call
            calls = {**{name: run(fn) for name, fn in plans.items()},
                     "torch.softmax": lambda i: torch.softmax(xs[i % sets], -1),
                     "default": lambda i: ta.softmax(xs[i % sets], -1)}
            ref = torch.softmax(xs[0].double(), -1)
            e_torch = h.max_err(torch.softmax(xs[0], -1), ref)
            ok = {}
            for name, call in calls.items():
                chk = h.check_rule(call(0).clone(), ref, e_torch, dtype)
                ok[name] = chk.ok
            del ref
            times = {k: [] for k in calls}
            first = {}  # round 1's Timing (its graph column); later rounds are CudaTimer.again's
            for r in range(args.rounds):
                for name, call in calls.items():
                    if not ok[name]:
                        continue
                    if r == 0:
                        first[name] = timer.measure(call, sets, graphable=True)
                        times[name].append(first[name].ms)
                    elif (ms := timer.again(call, sets, first[name])) is not None:
                        times[name].append(ms)
            graph = {k: t.graph_ms for k, t in first.items()}
            rec = dict(set=s["set"], M=m, N=n, dtype=dt, ok=ok,
                       eager_ms={k: statistics.median(v) for k, v in times.items() if v},
                       eager_rounds_ms=times, graph_ms=graph)
            gbps = {k: nbytes / v / 1e6 for k, v in rec["eager_ms"].items()}
            rec["eager_gbps"] = gbps
            rows.append(rec)
            pct = {k: 100 * v / copy_gbps for k, v in gbps.items()}
            e, gr = rec["eager_ms"], graph
            ratio = (lambda a, b, d: f"{d[b] / d[a]:.2f}x" if d.get(a) and d.get(b) else "n/a")
            print(f"{dt} {m}x{n} ({nbytes / 2**20:.0f} MB moved) "
                  + " ".join(f"{k}={pct[k]:.0f}%" for k in pct)
                  + f" | keep/old {ratio('keep', 'old', e)} (graph {ratio('keep', 'old', gr)}),"
                  f" window/keep {ratio('window', 'keep', e)} (graph {ratio('window', 'keep', gr)}),"
                  f" keep/torch {ratio('keep', 'torch.softmax', e)}" + ("" if all(ok.values()) else f" ok={ok}"),
                  flush=True)
            del xs, outs, plans
    print("\n==== summary (eager, median of rounds): keep over old, window over keep, keep over torch ====")
    for dt in args.dtypes.split(","):
        r = [x for x in rows if x["dtype"] == dt and all(k in x["eager_ms"] for k in (*VARIANTS, "torch.softmax"))]
        if not r:
            continue
        for a, b in (("keep", "old"), ("window", "keep"), ("keep", "torch.softmax")):
            q = sorted(x["eager_ms"][b] / x["eager_ms"][a] for x in r)
            print(f"{dt} {a}/{b}: {len(r)} shapes, min {q[0]:.2f} median {statistics.median(q):.2f} max {q[-1]:.2f}")
        esize = torch.empty((), dtype=DTYPES[dt]).element_size()
        big = [x for x in r if x["M"] * x["N"] * esize >= 64 << 20]
        print(f"{dt} >= 64 MB, % of copy old / keep / window / torch: "
              + ", ".join(f"{x['M']}x{x['N']} " + "/".join(f"{100 * x['eager_gbps'][k] / copy_gbps:.0f}"
                                                     for k in (*VARIANTS, "torch.softmax")) for x in big))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(copy_gbps=copy_gbps, device=torch.cuda.get_device_name(),
                                                  rows=rows), indent=1))


if __name__ == "__main__":
    main()
