"""Time every softmax kernel of every backend on issue 16's random shapes; fit and check backend=None's
selection (configs.SOFTMAX_SELECT, read by tiled_attn/softmax_select.py).

    PYTHONPATH=. python benchmarks/sweep_softmax_random.py --out $OUT/softmax_random --budget 400
    python benchmarks/sweep_softmax_random.py --apply $OUT/softmax_random/sweep.json   # no GPU
    PYTHONPATH=. python benchmarks/sweep_softmax_random.py --heldout --out DIR        # the table in configs.py
    python benchmarks/sweep_softmax_random.py --dry-run                                # plan + estimate only

One GPU call does it all: (1) the CUDA extension builds in a thread while --jobs worker processes
run every Triton kernel once on every shape (sweep and held-out), so Triton's disk cache holds the
binaries before anything is timed (compiling beside the timing would load the host that eager
timing measures); (2) the sweep: for each shape of harness.random_softmax_sets()[0] (>= 60 row
lengths log-uniform in [1, 2^25], M·N log-uniform in [2^20, 2^28]) and of the benchmark's ladder
(suite_softmax.SHAPES, whose eager bar the fit must see; --no-ladder leaves them out) and each dtype,
timed in --rounds interleaved eager rounds (the median), every kernel of
ta.softmax_kernels("triton") and ("cuda") pinned, backend=None as it is before the fit
("default") and torch.softmax, through harness.run_suite: checked against float64 (DESIGN §4),
then timed eager (harness.CudaTimer: per-call CUDA events over back-to-back calls, inputs rotating
through >= 2x L2; a kernel that refuses a size is recorded unsupported); (3) the fit (`fit_rows`):
per (dtype, layout, pool) rows over N — and M where a split in M pays — minimizing the summed log
of each shape's time over the fastest kernel's (plus the log of any shortfall against
torch.softmax), a row boundary costing --lam; (4) the held-out check on harness.random_softmax_sets()
[1] (other seed, lengths the fit never saw): the selected kernel, backend=None ("default": the
selection where tiled_attn/softmax.py calls it), torch.softmax and the kernels the fit chose anywhere
(the contenders), per shape the ratios and the worst cases.

Writes --out/sweep.json (every record, the fitted table), heldout.json and summary.md; prints the
SOFTMAX_SELECT rows --apply writes into tiled_attn/configs.py. --budget is the whole call's wall
time from the start of this script: compiles stop at --compile-budget, the sweep leaves the
held-out check its share, and every phase writes what it measured before the next begins.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import fnmatch
import json
import math
import multiprocessing as mp
import os
import re
import sys
import threading
import time
from pathlib import Path

if "--smoke" in sys.argv:  # the interpreter must be chosen before any @triton.jit module loads
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tiled_attn as ta  # noqa: E402
from benchmarks import harness as h  # noqa: E402
from tiled_attn import configs, softmax_select  # noqa: E402

DTYPES = ("fp32", "bf16", "fp16")
TORCH, DEFAULT, SELECTED = "torch.softmax", "default", "selected"
# As suite_softmax: one thread per row past 131072 columns is 0.1 s to seconds a call.
THREAD_PER_ROW = ("naive", "online_thread")
THREAD_PER_ROW_MAX_N = 131072
LAM = 0.1  # a row boundary must buy >= 10% summed over its shapes: timing noise is ~2-3% a shape
# A pinned kernel must beat its backend's own rule by > 1% a shape to be chosen over it: where the
# rule runs that same kernel they time alike, and the rule carries its M-dependent switches to
# shapes the sweep did not draw.
PINNED = 0.01
# Cost model of the estimate (H100 host, 2026-11): a Triton compile ~1.2 s of one core; an eager
# call's host floor ~15 µs; DRAM ~2.5 TB/s for what a call and the float64 check move.
COMPILE_S, HOST_S, BW = 1.2, 15e-6, 2.5e12
EXT_BUILD_S = 60  # bindings.cpp (torch headers) ~50 s on one core; the .cu files 1-6 s each
SMOKE = dict(sweep=[dict(M=6, N=40), dict(M=3, N=300), dict(M=2, N=1500)],
             heldout=[dict(M=5, N=70), dict(M=2, N=900)])


def log(msg: str = "") -> None:
    print(msg, flush=True)


def esize(dt: str) -> int:
    return 4 if dt == "fp32" else 2


# ------------------------------------------------------------------------------------------------
# what is timed
# ------------------------------------------------------------------------------------------------
# A candidate of the fit: "backend:kernel" pinned, or "backend" alone, that backend's own kernel
# rule (kernel None: its M-dependent rules, e.g. few rows -> split, come with it).
def cand_name(backend: str, kernel: str | None) -> str:
    return backend if kernel is None else f"{backend}:{kernel}"


def parse_cand(name: str) -> tuple[str, str | None]:
    backend, _, kernel = name.partition(":")
    return backend, kernel or None


def is_cand(name: str) -> bool:
    return parse_cand(name)[0] in ("triton", "cuda")


def backend_of(name: str) -> str:
    return parse_cand(name)[0]


def all_kernels() -> list[str]:
    return [cand_name(b, k) for b in ("triton", "cuda") for k in (None, *ta.softmax_kernels(b))]


def pick_kernels(globs: str | None) -> list[str]:
    names = all_kernels()
    if not globs:
        return names
    pats = [g.strip() for g in globs.split(",") if g.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pats)]


def op_for(layout: str) -> h.Op:
    if layout == "contig":
        return h.SOFTMAX
    # Rows with column stride M: the transposed view of an (N, M) tensor (a softmax over dim 0).
    return dataclasses.replace(
        h.SOFTMAX, make_inputs=lambda c, dev, g: (h._randn((c["N"], c["M"]), c, dev, g).t(),),
        label=lambda c: f"{c['M']}x{c['N']} {c['dtype']} strided")


def kernel_provider(name: str, unavailable: dict) -> h.Provider:
    backend, kernel = parse_cand(name)
    supports = (h.max_cols(THREAD_PER_ROW_MAX_N, "one thread per row")
                if backend == "cuda" and kernel in THREAD_PER_ROW else None)
    return h.Provider(name, lambda c, inp, b=backend, k=kernel: ta.softmax(inp[0], -1, backend=b, kernel=k),
                      available=lambda d, b=backend: unavailable.get(b) or h.backend_unavailable(b, d),
                      supports=supports)


def selected_provider(arch: str, cuda_ok: bool) -> h.Provider:
    """The (backend, kernel) select() gives the case, pinned: what backend=None runs once
    tiled_attn/softmax.py calls the selection (DEFAULT shows whether it does)."""
    def fn(c, inp):
        x = inp[0]
        b, k = softmax_select.select(c["M"], c["N"], x.dtype, x.stride(-1) == 1 or c["N"] <= 1, arch, cuda_ok)
        return ta.softmax(x, -1, backend=b, kernel=k)
    return h.Provider(SELECTED, fn)


def suite_for(shape: dict, layout: str, dtypes, providers) -> h.Suite:
    return h.Suite(name="sweep_softmax_random", title="softmax kernels on random shapes",
                   op=op_for(layout), device="cuda", shapes=[dict(shape, layout=layout)],
                   dtypes=tuple(dtypes), providers=providers, baselines=(TORCH,))


# ------------------------------------------------------------------------------------------------
# plan and estimate
# ------------------------------------------------------------------------------------------------
def triton_jobs(shapes, dtypes, layouts, kernels, arch: str = "sm90") -> list[tuple]:
    """One worker job per (dtype, shape, layout): the Triton kernels to run once there."""
    # backend="triton" with its own rule runs one of the pinned kernels: nothing of its own
    tk = [parse_cand(n)[1] for n in kernels if backend_of(n) == "triton" and parse_cand(n)[1]]
    jobs = []
    for s in shapes:
        for dt in dtypes:
            for layout in layouts:
                # "row" takes rows up to its largest class: past it the call raises (no compile).
                ks = [k for k in tk if k != "row" or s["N"] <= softmax_select.max_n("triton", "row", arch, dt)]
                if ks:
                    jobs.append((dt, s["M"], s["N"], layout, tuple(ks)))
    return jobs


def case_seconds(m: int, n: int, dt: str, providers: int, warmup_ms: float, rep_ms: float,
                 rounds: int = 1) -> float:
    """Predicted wall time of one case: per provider the check call and its float64 comparison,
    the timer's first/estimate calls, warm-up and repeats (once a round); per case the inputs and
    reference."""
    call = max(HOST_S, 2 * m * n * esize(dt) / BW)
    check = 12 * m * n * 8 / BW + 4e-3  # + the harness's Python around one provider
    per = rounds * (warmup_ms + rep_ms) / 1e3 + 6 * call + check
    return 0.01 + 3 * 3 * m * n * 8 / BW + providers * per


def compile_count(jobs) -> float:
    """The Triton compiles the jobs need, as far as the plan decides them: Triton specializes
    integer arguments on == 1 and on divisibility by 16, so "row" compiles once per (dtype,
    BLOCK_N = next_pow2(N), masked or not, N % 16 == 0, M == 1); "online" has one tile per dtype,
    so once per (dtype, N % 16 == 0, M == 1); "split" sizes its merge by the splits (BLOCK_S =
    next_pow2) and may try its single pass before falling back: ~1.5 per (dtype, shape)."""
    keys, split = set(), 0
    for dt, m, n, layout, kernels in jobs:
        aligned, one_row = n % 16 == 0, m == 1
        for k in kernels:
            if k == "row":
                p2 = 1 << (n - 1).bit_length()
                keys.add(("row", dt, layout, p2, p2 != n, aligned, one_row))
            elif k == "online":
                keys.add(("online", dt, layout, aligned, one_row))
            else:
                split += 1
    return len(keys) + 1.5 * split


def estimate(sweep, heldout, dtypes, layouts, kernels, args) -> dict:
    jobs = triton_jobs(sweep + heldout, dtypes, layouts, kernels)
    compiles = compile_count(jobs)
    procs = max(1, args.jobs)
    compile_s = 10 + compiles * COMPILE_S / procs
    n_sweep = len(kernels) + 2
    rounds = getattr(args, "rounds", 1)
    sweep_s = sum(case_seconds(s["M"], s["N"], dt, n_sweep, args.warmup_ms, args.reps_ms, rounds)
                  for s in sweep for dt in dtypes for _ in layouts)
    n_held = 3 + min(len(kernels), 8)
    held_s = sum(case_seconds(s["M"], s["N"], dt, n_held, args.warmup_ms, args.reps_ms, rounds)
                 for s in heldout for dt in dtypes for _ in layouts)
    build_s = EXT_BUILD_S if any(backend_of(k) == "cuda" for k in kernels) else 0
    # Each compiled kernel is loaded from Triton's disk cache at its first timed call (~20 ms).
    return dict(jobs=len(jobs), compiles=round(compiles), compile_s=compile_s, sweep_s=sweep_s,
                heldout_s=held_s, total_s=20 + max(compile_s, build_s) + 0.02 * compiles + sweep_s + held_s)


def print_plan(sweep, heldout, dtypes, layouts, kernels, args, est) -> None:
    def lengths(shapes):
        npow2 = sum(1 for s in shapes if s["N"] & (s["N"] - 1) == 0)
        return (f"{len(shapes)} shapes ({len(shapes) - npow2} row lengths not a power of two, N "
                f"{min(s['N'] for s in shapes)}..{max(s['N'] for s in shapes)})" if shapes else "none")
    log(f"sweep: {lengths(sweep)}; held-out: {lengths(heldout)}; x {len(dtypes)} dtypes "
        f"({','.join(dtypes)}) x {len(layouts)} layouts ({','.join(layouts)})")
    log(f"kernels ({len(kernels)}): {', '.join(kernels)}; plus {DEFAULT} and {TORCH}")
    log(f"estimate: {est['jobs']} compile jobs, ~{est['compiles']} Triton compiles on {args.jobs} "
        f"procs ~{est['compile_s']:.0f} s (the CUDA extension, if not built yet, ~{EXT_BUILD_S} s "
        f"beside them); sweep timing ~{est['sweep_s']:.0f} s; held-out ~{est['heldout_s']:.0f} s; "
        f"with startup ~{est['total_s']:.0f} s in all (--budget {args.budget:.0f} s)")


# ------------------------------------------------------------------------------------------------
# compile first (worker processes) and the CUDA extension (a thread)
# ------------------------------------------------------------------------------------------------
def _precompile(job) -> list[str]:
    """Worker: run each Triton kernel once on the real shape, so its binaries land in Triton's
    disk cache (zeros: the values do not change what compiles)."""
    dt, m, n, layout, kernels = job
    dtype = h.DTYPES[dt]
    x = (torch.zeros(m, n, device="cuda", dtype=dtype) if layout == "contig"
         else torch.zeros(n, m, device="cuda", dtype=dtype).t())
    errors = []
    for k in kernels:
        try:
            ta.softmax(x, -1, backend="triton", kernel=k)
        except Exception as e:  # noqa: BLE001 -- recorded again (unsupported) by the timing pass
            errors.append(f"{dt} {m}x{n} {layout} {k}: {type(e).__name__}: {str(e)[:120]}")
    torch.cuda.synchronize()
    return errors


def precompile(jobs: list, procs: int, deadline: float) -> None:
    if not jobs or procs < 1:
        return
    t0 = time.perf_counter()
    pool = cf.ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn"), initializer=torch.cuda.init)
    futures = [pool.submit(_precompile, j) for j in jobs]
    done, pending = cf.wait(futures, timeout=max(1.0, deadline - time.perf_counter()))
    errors = [e for f in done if not f.exception() for e in f.result()]
    crashed = [f.exception() for f in done if f.exception()]
    workers = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in workers:  # a compile still running would load the host the eager timing measures
        if p.is_alive():
            p.terminate()
    for p in workers:
        p.join(5)
    for e in (errors + [h._describe(c) for c in crashed])[:6]:
        log(f"  precompile: {e}")
    log(f"precompiled {len(done)}/{len(jobs)} jobs in {time.perf_counter() - t0:.0f} s"
        + (f" ({len(pending)} left at the compile budget: they compile when first timed)" if pending else ""))


class ExtBuild:
    """tiled_attn.cuda's extension built in a thread (ninja runs the compilers beside the Triton
    workers); `wait` gives None when it loaded, else why not."""

    def __init__(self, wanted: bool):
        self.error, self.seconds = None, None
        self.thread = None
        if not wanted:
            self.error = "no cuda:* kernel asked for"
            return
        reason = h.backend_unavailable("cuda", torch.device("cuda"))
        if reason:
            self.error = reason
            return
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        t0 = time.perf_counter()
        try:
            from tiled_attn.cuda import _build
            _build.load(torch.device("cuda", torch.cuda.current_device()))
        except Exception as e:  # noqa: BLE001 -- the CUDA kernels are then recorded unavailable
            self.error = h._describe(e)
        self.seconds = time.perf_counter() - t0

    def wait(self, deadline: float) -> str | None:
        if self.thread is not None:
            self.thread.join(max(0.0, deadline - time.perf_counter()))
            if self.thread.is_alive():
                self.error = "the CUDA extension build did not finish within the compile budget"
            self.thread = None
            log(f"CUDA extension: {self.error or 'loaded'}"
                + (f" in {self.seconds:.0f} s" if self.seconds is not None else ""))
        return self.error


# ------------------------------------------------------------------------------------------------
# timing (harness.run_suite, one shape at a time: a budget cut leaves every range of N sampled)
# ------------------------------------------------------------------------------------------------
def time_shapes(shapes, dtypes, layouts, providers, cfg, deadline, seed, tag) -> tuple[list, str]:
    records, lost = [], ""
    t0 = time.perf_counter()
    for i, shape in enumerate(shapes):
        for layout in layouts:
            suite = suite_for(shape, layout, dtypes, providers)
            left = deadline - time.perf_counter()
            if left <= 0 or lost:
                why = lost or "--budget reached"
                records += [h._record(suite, c, p.name, p.role, h.SKIPPED, error=why)
                            for c in suite.cases() for p in providers]
                continue
            res = h.run_suite(suite, dataclasses.replace(cfg, time_cap_s=left, seed=seed + 7919 * i))
            records += res["records"]
            lost = lost or res["device_lost"]
            for dt in dtypes:
                log(f"{time.perf_counter() - t0:6.1f}s {tag} {line(res['records'], dt)}")
    return records, lost


def line(records, dt) -> str:
    recs = [r for r in records if r["case"]["dtype"] == dt]
    if not recs:
        return dt
    ok = {r["provider"]: r for r in recs if r["status"] == h.OK}
    label = recs[0]["label"]
    t = ok.get(TORCH)
    kern = [r for n, r in ok.items() if is_cand(n)]
    best = min(kern, key=lambda r: r["ms"], default=None)

    def fig(r):
        if not r:
            return "-"
        vs = f" {t['ms'] / r['ms']:.2f}x" if t else ""
        return f"{r['ms'] * 1e3:.1f}us {r['pct_ceiling'] or 0:.0f}%{vs}"
    bad = [f"{r['provider']} {r['status']}" for r in recs if r["status"] in (h.FAILED, h.ERROR)]
    return (f"{label}: torch {fig(t)} | default {fig(ok.get(DEFAULT))} | selected "
            f"{fig(ok.get(SELECTED))} | best {best['provider'] if best else '-'} {fig(best)}"
            + (f" | {'; '.join(bad)}" if bad else ""))


# ------------------------------------------------------------------------------------------------
# the fit
# ------------------------------------------------------------------------------------------------
def _layout(rec: dict) -> str:
    return rec["case"].get("layout", "contig")


def points_of(records, dt: str, layout: str, cands) -> list[dict]:
    """Per shape: {n, m, times {cand: ms}, torch}; shapes with no candidate timed are left out."""
    by = {}
    for r in records:
        c = r["case"]
        if c["dtype"] != dt or _layout(r) != layout or r["status"] != h.OK:
            continue
        p = by.setdefault((c["N"], c["M"]), dict(n=c["N"], m=c["M"], times={}, torch=None))
        if r["provider"] == TORCH:
            p["torch"] = r["ms"]
        elif r["provider"] in cands:
            p["times"][r["provider"]] = r["ms"]
    return sorted((p for p in by.values() if p["times"]), key=lambda p: (p["n"], p["m"]))


def _boundary(a: int, b: int) -> int:
    """A row bound between two measured lengths a < b: the largest power of two in [a, b) (the
    kernels' tiles change at powers of two), else their geometric mean."""
    p = 1 << (b - 1).bit_length() - 1
    return p if p >= a else max(a, math.isqrt(a * b))


def fit_rows(points, cands, limit, lam=LAM, torch_weight=1.0, top=None, prior=lambda c: 0.0):
    """Rows [(n_max, m_min, cand)] over the points sorted by N (see the module docstring), and each
    point's chosen cand. `limit(cand)` is the longest row cand takes; a row's cand must take every
    N up to its n_max. `top`: the last row's n_max (default: the largest power of two >= the
    longest row measured). `prior(cand)`: a loss added at every point (a preference)."""
    cands = sorted(cands)
    if not points or not cands:
        return [], []
    inf = math.inf
    loss = []
    for p in points:
        best = min(p["times"][c] for c in p["times"] if c in cands) if any(c in cands for c in p["times"]) else None
        row = []
        for c in cands:
            t = p["times"].get(c)
            if t is None or best is None:
                row.append(inf)
                continue
            short = math.log(t / p["torch"]) if p["torch"] else 0.0
            row.append(math.log(t / best) + torch_weight * max(0.0, short) + prior(c))
        loss.append(row)
    s = len(points)
    top = top or 1 << (points[-1]["n"] - 1).bit_length()
    bounds = [None] + [_boundary(points[j - 1]["n"], points[j]["n"]) for j in range(1, s)] + [top]
    # The last row may stop at its kernel's limit instead of `top` (past it: the old choice).
    need = bounds[:s] + [points[-1]["n"]]
    ok_cand = {j: [i for i, c in enumerate(cands) if limit(c) >= need[j]] for j in range(1, s + 1)}
    cum = [[0.0] * len(cands)]
    for row in loss:
        cum.append([a + b for a, b in zip(cum[-1], row)])

    def segment(i, j):
        allowed = ok_cand[j]
        if not allowed:
            return inf, None
        single = min(allowed, key=lambda c: (cum[j][c] - cum[i][c], c))
        best = (cum[j][single] - cum[i][single], [(1, single)])
        idx = sorted(range(i, j), key=lambda k: points[k]["m"])
        pre = [0.0] * len(cands)
        for t in range(1, len(idx)):
            k = idx[t - 1]
            pre = [a + loss[k][c] for c, a in enumerate(pre)]
            m_lo, m_hi = points[k]["m"], points[idx[t]]["m"]
            if m_lo == m_hi:
                continue
            lo = min(allowed, key=lambda c: (pre[c], c))
            hi = min(allowed, key=lambda c: (cum[j][c] - cum[i][c] - pre[c], c))
            cost = pre[lo] + cum[j][hi] - cum[i][hi] - pre[hi] + lam
            if lo != hi and cost < best[0]:
                best = (cost, [(max(m_lo + 1, math.isqrt(m_lo * m_hi)), hi), (1, lo)])
        return best

    dp = [(0.0, None, None)] + [(inf, None, None)] * s
    for j in range(1, s + 1):
        for i in range(j):
            if dp[i][0] == inf:
                continue
            cost, rule = segment(i, j)
            total = dp[i][0] + cost + lam
            if total < dp[j][0]:
                dp[j] = (total, i, rule)
    if dp[s][0] == inf:
        return [], []
    segs, j = [], s
    while j:
        _, i, rule = dp[j]
        segs.append((i, j, rule))
        j = i
    segs.reverse()
    chosen = [None] * s
    merged = []  # [n_max, rule as [(m_min, cand)]]: a single choice equal to the one before extends it
    for i, j, rule in segs:
        for k in range(i, j):
            chosen[k] = cands[next(c for m_min, c in rule if points[k]["m"] >= m_min)]
        if merged and len(rule) == 1 and merged[-1][1] == rule:
            merged[-1][0] = bounds[j]
        else:
            merged.append([bounds[j], rule])
    if merged:
        merged[-1][0] = min([merged[-1][0]] + [limit(cands[c]) for _, c in merged[-1][1]])
    rows = [(n_max, m_min, cands[c]) for n_max, rule in merged for m_min, c in rule]
    return rows, chosen


def fit(records, dtypes, layouts, arch: str, lam: float = LAM) -> tuple[dict, list]:
    """{(arch, dtype, layout, pool): rows (n_max, m_min, backend, kernel)} and a per-point report."""
    table, report = {}, []
    kernels = {r["provider"] for r in records if is_cand(r["provider"]) and r["status"] == h.OK}
    for dt in dtypes:
        for layout in layouts:
            for pool in ("all", "triton"):
                cands = sorted(k for k in kernels if pool == "all" or backend_of(k) == "triton")
                if pool == "all" and not any(backend_of(k) == "cuda" for k in cands):
                    continue  # no CUDA kernel timed: the "triton" rows serve both

                def limit(c, dt=dt):
                    return softmax_select.max_n(*parse_cand(c), arch, dt)
                pts = points_of(records, dt, layout, cands)
                rows, chosen = fit_rows(pts, cands, limit, lam, prior=lambda c: PINNED if parse_cand(c)[1] else 0.0,
                                        top=h.RANDOM_SOFTMAX["n_max"] if pts and pts[-1]["n"] <= h.RANDOM_SOFTMAX["n_max"] else None)
                if not rows:
                    continue
                table[(arch, dt, layout, pool)] = tuple((n, m, *parse_cand(c)) for n, m, c in rows)
                for p, c in zip(pts, chosen):
                    best = min(p["times"].values())
                    report.append(dict(dtype=dt, layout=layout, pool=pool, M=p["m"], N=p["n"], chosen=c,
                                       vs_best=best / p["times"][c],
                                       vs_torch=p["torch"] / p["times"][c] if p["torch"] else None,
                                       best=min(p["times"], key=p["times"].get)))
    return table, report


# ------------------------------------------------------------------------------------------------
# --apply: the fitted rows into configs.SOFTMAX_SELECT
# ------------------------------------------------------------------------------------------------
BEGIN = "    # ---- sweep_softmax_random.py --apply (begin)"
END = "    # ---- sweep_softmax_random.py --apply (end)"


def table_to_json(table: dict) -> list:
    return [[list(k), [list(r) for r in rows]] for k, rows in table.items()]


def table_from_json(items: list) -> dict:
    return {tuple(k): tuple(tuple(r) for r in rows) for k, rows in items}


def _row_note(report, key, rows, i) -> str:
    _, dt, layout, pool = key
    n_max, m_min, b, k = rows[i]
    n_lo = max((r[0] for r in rows[:i] if r[0] < n_max), default=0)
    pts = [p for p in report if (p["dtype"], p["layout"], p["pool"]) == (dt, layout, pool)
           and n_lo < p["N"] <= n_max and p["M"] >= m_min and p["chosen"] == cand_name(b, k)]
    if not pts:
        return "no shape measured here"
    vb = [p["vs_best"] for p in pts]
    vt = [p["vs_torch"] for p in pts if p["vs_torch"]]
    return (f"{len(pts)} shape{'s' * (len(pts) != 1)}: {min(vb):.2f}-{max(vb):.2f}x the fastest" +
            (f", {min(vt):.2f}-{max(vt):.2f}x torch" if vt else ""))


def markers(key: str) -> tuple[str, str]:
    """The --apply block's first and last lines for the table key `key`: an arch's ("sm90") rows
    between the plain markers, a GPU model's ("sm90:h200", configs.model_arch) between its own."""
    if ":" not in key:
        return BEGIN, END
    return BEGIN.replace("--apply", f"--apply {key}"), END.replace("--apply", f"--apply {key}")


def block_lines(doc: dict) -> list[str]:
    meta, table = doc["meta"], table_from_json(doc["table"])
    report = doc.get("fit_report", [])
    held = doc.get("heldout_summary") or {}
    begin, end = markers(meta.get("key") or meta.get("arch", ""))
    lines = [begin + f": {meta['date']}, {meta['device']}, copy {meta['copy_gbps']:.0f} GB/s.",
             f"    # {meta['points']} shapes x {','.join(meta['dtypes'])}, eager; each row: its shapes' "
             "time vs the fastest kernel's, and vs torch.softmax."]
    if held:
        lines.append(f"    # Held-out ({held['cases']} cases): {held['line']}")
    for key in sorted(table):
        rows = table[key]
        lines.append(f"    ({', '.join(json.dumps(v) for v in key)}): (")
        for i, (n_max, m_min, b, k) in enumerate(rows):
            lines.append(f"        ({n_max}, {m_min}, {json.dumps(b)}, {'None' if k is None else json.dumps(k)}),  "
                         f"# {_row_note(report, key, rows, i)}")
        lines.append("    ),")
    return lines + [end]


def apply(sweep_json: Path, root: Path = ROOT, allow_any_arch: bool = False) -> list[str]:
    """Write the fitted rows of sweep_json between the markers of SOFTMAX_SELECT in
    root/tiled_attn/configs.py (idempotent: an earlier block of the same key is replaced). A GPU
    model's block ("sm90:h200") that is not there yet goes in before its arch's block, whose rows
    stay for the arch's other models."""
    doc = json.loads(Path(sweep_json).read_text())
    if doc["meta"]["arch"] != "sm90" and not allow_any_arch:
        raise SystemExit(f"{sweep_json} was measured on {doc['meta']['arch']}, not sm90")
    path = Path(root) / "tiled_attn" / "configs.py"
    text = path.read_text()
    if not re.search(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n", text, flags=re.S):
        raise SystemExit(f"{path}: no SOFTMAX_SELECT --apply markers")
    begin, end = markers(doc["meta"].get("key", doc["meta"]["arch"]))
    lines = block_lines(doc)
    new = "\n".join(lines) + "\n"
    block = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n", flags=re.S)
    if block.search(text):
        text = block.sub(lambda _: new, text, count=1)
    else:
        at = text.index(BEGIN)
        text = text[:at] + new + text[at:]
    path.write_text(text)
    return lines


def install(table: dict) -> dict:
    saved = dict(configs.SOFTMAX_SELECT)
    configs.SOFTMAX_SELECT.clear()
    configs.SOFTMAX_SELECT.update(table)
    return saved


# ------------------------------------------------------------------------------------------------
# the held-out report
# ------------------------------------------------------------------------------------------------
def heldout_summary(records, dtypes, layouts, wired: bool) -> dict:
    """Per case: the selection's time vs torch.softmax and vs the fastest contender; the worst."""
    head = DEFAULT if wired else SELECTED
    rows = []
    for r0 in records:
        if r0["provider"] != TORCH or r0["status"] != h.OK:
            continue
        c = r0["case"]
        same = [r for r in records if r["case"] == c and r["status"] == h.OK]
        ok = {r["provider"]: r for r in same}
        sel = ok.get(head)
        kern = [r for r in same if is_cand(r["provider"])]
        best = min(kern, key=lambda r: r["ms"], default=None)
        if sel is None:
            continue
        mb = c["M"] * c["N"] * esize(c["dtype"]) / 2 ** 20
        rows.append(dict(label=r0["label"], dtype=c["dtype"], M=c["M"], N=c["N"], layout=c.get("layout", "contig"),
                         ms=sel["ms"], pct_copy=sel["pct_ceiling"], vs_torch=r0["ms"] / sel["ms"],
                         vs_best=best["ms"] / sel["ms"] if best else None,
                         best=best["provider"] if best else None,
                         default_vs_torch=r0["ms"] / ok[DEFAULT]["ms"] if DEFAULT in ok else None,
                         on_chip_64mb=c["N"] <= 32768 and mb >= 64))
    if not rows:
        return dict(cases=0, rows=[], line="nothing measured")
    below = [r for r in rows if r["vs_torch"] < 1.0]
    chip = [r for r in rows if r["on_chip_64mb"]]
    chip_low = [r for r in chip if (r["pct_copy"] or 0) < 90]
    vt = sorted(r["vs_torch"] for r in rows)
    vb = sorted(r["vs_best"] for r in rows if r["vs_best"])
    text = (f"{head} vs torch.softmax min {vt[0]:.2f}x, median {vt[len(vt) // 2]:.2f}x, {len(below)} "
            f"below 1.0x; vs the fastest contender min {vb[0] if vb else 0:.2f}x, median "
            f"{vb[len(vb) // 2] if vb else 0:.2f}x; on chip and >= 64 MB: {len(chip) - len(chip_low)}/"
            f"{len(chip)} at >= 90% of copy")
    return dict(cases=len(rows), head=head, wired=wired, rows=rows, line=text,
                worst_vs_torch=sorted(rows, key=lambda r: r["vs_torch"])[:8],
                worst_vs_best=sorted((r for r in rows if r["vs_best"]), key=lambda r: r["vs_best"])[:8])


def wired_now(arch: str, cuda_ok: bool, device: torch.device, dtypes) -> bool:
    """Whether backend=None already follows select() (tiled_attn/softmax.py calls it): the plan it
    makes on a small probe inside a fitted row against select()'s answer there."""
    sm = sys.modules["tiled_attn.softmax"]
    for (a, dt, layout, pool), rows in configs.SOFTMAX_SELECT.items():
        if a not in (arch, configs.base_arch(arch)) or layout != "contig" or dt not in dtypes:
            continue
        n = min(rows[0][0], 16)
        x = torch.empty(max(rows[0][1], 1), n, device=device, dtype=h.DTYPES[dt])
        try:
            plan = sm._plan_for(x, 1, None, None)
        except Exception as e:  # noqa: BLE001 -- then the held-out "default" says what it runs
            log(f"wiring probe failed: {h._describe(e)}")
            return False
        return (plan.backend, plan.kernel) == softmax_select.select(x.shape[0], n, x.dtype, True, arch, cuda_ok)
    return False


def markdown(doc: dict, held: dict | None) -> str:
    meta = doc["meta"]
    out = [f"# Softmax on issue 16's random shapes: {meta['device']} ({meta['arch']}), {meta['date']}",
           "", f"copy {meta['copy_gbps']:.0f} GB/s; eager (per-call CUDA events); {meta['command']}",
           f"sweep seed {h.RANDOM_SOFTMAX['sweep_seed']}, held-out seed {h.RANDOM_SOFTMAX['heldout_seed']}; "
           f"{meta['seconds']:.0f} s; {meta.get('aborted') or 'complete'}", "", "## The fit", ""]
    out += ["```"] + block_lines(doc) + ["```", "", "## Sweep: per shape", "",
                                         "| shape | dtype | pool | chosen | vs best | vs torch | best |",
                                         "|---|---|---|---|---|---|---|"]
    for p in doc.get("fit_report", []):
        out.append(f"| {p['M']}x{p['N']} | {p['dtype']} {p['layout']} | {p['pool']} | {p['chosen']} | "
                   f"{p['vs_best']:.2f}x | {p['vs_torch'] or 0:.2f}x | {p['best']} |")
    if held:
        out += ["", "## Held-out check", "", held["line"], "",
                "| shape | dtype | selected | % copy | vs torch | vs best (which) | default vs torch |",
                "|---|---|---|---|---|---|---|"]
        for r in held["rows"]:
            out.append(f"| {r['M']}x{r['N']} | {r['dtype']} {r['layout']} | {r['ms'] * 1e3:.1f} us | "
                       f"{r['pct_copy'] or 0:.0f}% | {r['vs_torch']:.2f}x | {r['vs_best'] or 0:.2f}x "
                       f"({r['best']}) | {r['default_vs_torch'] or 0:.2f}x |")
        out += ["", "Worst vs torch.softmax: " + ", ".join(
            f"{r['label']} {r['vs_torch']:.2f}x" for r in held["worst_vs_torch"]),
            "Worst vs the fastest contender: " + ", ".join(
            f"{r['label']} {r['vs_best']:.2f}x ({r['best']})" for r in held["worst_vs_best"])]
    bad = [r for r in doc["records"] if r["status"] in (h.FAILED, h.ERROR)]
    out += ["", f"{len(doc['records'])} sweep records, {len(bad)} FAILED/error:"]
    out += [f"- {r['label']} {r['provider']} {r['status']}: {r['error'][:200]}" for r in bad[:40]]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for sweep.json, heldout.json, summary.md")
    ap.add_argument("--apply", type=Path, metavar="SWEEP_JSON", help="its fitted rows -> configs.py")
    ap.add_argument("--heldout", action="store_true",
                    help="only the held-out check, with configs.SOFTMAX_SELECT as it is")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and estimate; time nothing")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny shapes in the Triton interpreter")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma list of fp32, bf16, fp16")
    ap.add_argument("--layouts", default="contig", help="comma list of contig, strided")
    ap.add_argument("--max-shapes", type=int, default=None, help="the first K sweep shapes only")
    ap.add_argument("--max-heldout", type=int, default=None, help="the first K held-out shapes only")
    ap.add_argument("--kernels", default=None,
                    help="comma globs on backend:kernel names, e.g. 'triton:*,cuda:warp_row' (default all)")
    ap.add_argument("--reps-ms", type=float, default=10.0, help="ms of timed repeats per point")
    ap.add_argument("--warmup-ms", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3,
                    help="eager rounds per shape, kernels in turn (harness.CudaTimer.rounds): the median")
    ap.add_argument("--no-ladder", dest="ladder", action="store_false",
                    help="fit on the random shapes only, not the benchmark's ladder as well")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds for the whole call")
    ap.add_argument("--compile-budget", type=float, default=None,
                    help="seconds for the compile phase (default: 40%% of --budget)")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compile processes")
    ap.add_argument("--lam", type=float, default=LAM, help="cost of one more row in the fit")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    if args.apply:
        log("\n".join(apply(args.apply)))
        return 0
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    if not set(dtypes) <= set(DTYPES) or not set(layouts) <= {"contig", "strided"}:
        raise SystemExit(f"--dtypes from {DTYPES}, --layouts from contig, strided")
    sweep, heldout = (SMOKE["sweep"], SMOKE["heldout"]) if args.smoke else h.random_softmax_sets()
    sweep, heldout = sweep[:args.max_shapes], heldout[:args.max_heldout]
    if args.ladder and not args.smoke:
        # The benchmark's ladder (suite_softmax.SHAPES) in the fit too: its shapes carry the eager
        # bar, and on 2026-11-27 a fit without them sent 512x131072 bf16 to a `split` row that ran
        # it at 1.26x torch where Triton's own rule ran 1.68x. None of their lengths is a held-out one.
        from benchmarks import suite_softmax
        have = {(c["M"], c["N"]) for c in sweep}
        sweep = sweep + [dict(c) for c in suite_softmax.SHAPES if (c["M"], c["N"]) not in have]
    if args.heldout:
        sweep = []
    kernels = pick_kernels(args.kernels)
    est = estimate(sweep, heldout, dtypes, layouts, kernels, args)
    print_plan(sweep, heldout, dtypes, layouts, kernels, args, est)
    if args.dry_run:
        return 0
    if args.out is None:
        raise SystemExit("--out is required (or --apply / --dry-run)")
    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("the sweep needs a CUDA device (--smoke runs a CPU miniature, --dry-run the plan)")
    device = torch.device("cpu" if smoke else "cuda")
    arch = configs.arch(device)
    key = configs.model_arch(device)  # the fitted rows' key: this GPU model's own (configs.py)
    deadline = t0 + args.budget
    compile_deadline = t0 + (args.compile_budget if args.compile_budget is not None else 0.4 * args.budget)

    # (1) compile: the extension in a thread, the Triton kernels on worker processes
    unavailable: dict = {}
    build = None
    if not smoke:
        build = ExtBuild(any(backend_of(k) == "cuda" for k in kernels))
        precompile(triton_jobs(sweep + heldout, dtypes, layouts, kernels, arch), args.jobs, compile_deadline)
        # The build may outlast the Triton compiles: it gets the compile budget, or a minute more
        # when the compiles ended early (the CUDA kernels are half of what the sweep compares).
        unavailable["cuda"] = build.wait(max(compile_deadline, time.perf_counter() + 60))
    cuda_ok = not smoke and not unavailable.get("cuda")

    timer = (h.CpuTimer(0.0, 1.0, 1) if smoke
             else h.CudaTimer(args.warmup_ms, args.reps_ms, graphs=False, rounds=args.rounds))
    ceilings = h.measure_ceilings(device, h.CpuTimer(0.0, 5.0, 1) if smoke else h.CudaTimer(2.0, 20.0, graphs=False))
    cfg = h.RunConfig(device=device, timer=timer, ceilings=ceilings)
    devname = "cpu (smoke)" if smoke else torch.cuda.get_device_name()
    log(f"{devname} ({arch}): copy {ceilings['copy_gbps']:.0f} GB/s; {time.perf_counter() - t0:.0f} s so far")
    meta = dict(device=devname, arch=arch, key=key, date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                triton=__import__("triton").__version__, copy_gbps=ceilings["copy_gbps"],
                dtypes=dtypes, layouts=layouts, kernels=kernels, cuda=unavailable.get("cuda") or "available",
                reps_ms=args.reps_ms, warmup_ms=args.warmup_ms, lam=args.lam, estimate=est,
                command=" ".join(["benchmarks/sweep_softmax_random.py"] + list(argv if argv is not None else sys.argv[1:])))
    args.out.mkdir(parents=True, exist_ok=True)
    provs = [kernel_provider(n, unavailable) for n in kernels]
    saved = dict(configs.SOFTMAX_SELECT)
    doc, aborted = None, ""
    try:
        if sweep:
            # (2) the sweep, backend=None as it was before any fit ("default")
            install({})
            # the held-out check's share: its estimate with room (the estimate leaves out slow rungs)
            sweep_deadline = deadline - min(0.3 * args.budget, max(45.0, 1.5 * est["heldout_s"] + 10))
            records, aborted = time_shapes(sweep, dtypes, layouts,
                                           provs + [h.default_softmax(), h.torch_softmax()],
                                           cfg, sweep_deadline, 16_000, "sweep")
            # (3) the fit
            table, report = fit(records, dtypes, layouts, key, args.lam)
            meta.update(points=len(sweep), seconds=time.perf_counter() - t0, aborted=aborted)
            doc = dict(meta=meta, shapes=dict(sweep=sweep, heldout=heldout), table=table_to_json(table),
                       fit_report=report, records=records)
            (args.out / "sweep.json").write_text(json.dumps(doc, indent=1))
            log("\n".join(block_lines(doc)))
            install(table)
        else:
            table = dict(configs.SOFTMAX_SELECT)
        # (4) the held-out check
        held = None
        if heldout and not aborted:
            wired = wired_now(key, cuda_ok, device, dtypes)
            names = {cand_name(b, k) for rows in table.values() for _, _, b, k in rows}
            if doc:
                names |= {p["best"] for p in doc["fit_report"]}
            contenders = [kernel_provider(n, unavailable) for n in kernels if n in names or not doc]
            hrecs, lost = time_shapes(heldout, dtypes, layouts,
                                      [selected_provider(key, cuda_ok), h.default_softmax(), h.torch_softmax()]
                                      + contenders, cfg, deadline, 61_000, "held-out")
            held = heldout_summary(hrecs, dtypes, layouts, wired)
            held_doc = dict(meta=dict(meta, seconds=time.perf_counter() - t0, aborted=lost, wired=wired),
                            shapes=heldout, table=table_to_json(table), summary=held, records=hrecs)
            (args.out / "heldout.json").write_text(json.dumps(held_doc, indent=1))
            log(f"held-out: {held['line']}" + ("" if wired else
                f" (backend=None does not call the selection yet: '{SELECTED}' is the selection pinned)"))
            if doc:
                doc["heldout_summary"] = dict(cases=held["cases"], line=held["line"])
                (args.out / "sweep.json").write_text(json.dumps(doc, indent=1))
        if doc:
            (args.out / "summary.md").write_text(markdown(doc, held))
        elif held:
            (args.out / "summary.md").write_text("\n".join(
                [f"# Held-out check, {meta['device']}, {meta['date']}", "", held["line"], ""]
                + [f"- {r['label']}: {r['vs_torch']:.2f}x torch, {r['vs_best'] or 0:.2f}x best ({r['best']})"
                   for r in held["rows"]]) + "\n")
    finally:
        install(saved)
    log(f"wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    return 1 if aborted else 0


if __name__ == "__main__":
    raise SystemExit(main())
