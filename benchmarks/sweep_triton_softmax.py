"""Sweep launch configs of the Triton softmax forward on this GPU; write the winners to configs.py.

    PYTHONPATH=. python benchmarks/sweep_triton_softmax.py --out $OUT/softmax_sweep [--quick]
    python benchmarks/sweep_triton_softmax.py --apply $OUT/softmax_sweep/sweep.json   # no GPU
    python benchmarks/sweep_triton_softmax.py --dry-run --out /tmp/s   # CPU smoke run (interpreter)

Per (shape, dtype) of the softmax ladder (benchmarks/suite_softmax.py) the kernels the dispatcher
could run there are timed: "row" where the row fits on chip; past that "split" (two kernels, x read
twice) where there are too few rows for the SMs, else "online", and for both the single-pass split
("split1": the "split" row with SINGLE_PASS, its "split_sync" row; reads x once). Each kernel starts
from its "any" row; phase 1 varies the tile (tile size × warps at 16-32 fp32 / 16-64 bf16 elements
per thread: 4-16 16-byte loads in flight); phase 2 crosses the --top fastest tiles with the optional
fields (STAGES, EVICT, WAVES, PROGRAMS_PER_SM, maxnreg, PREFETCH, CHUNK_TILES). Before each phase,
--jobs worker processes run every candidate once so Triton's disk cache holds the binaries.

A candidate is installed as this arch's row of size class exactly N (rows of this arch already in
the table are taken out for the run, so the "any" rows are the baseline) and run through the public
ta.softmax(x, -1, backend="triton", kernel=...), i.e. what is timed is what ships. It must launch
kernels without register spills (n_spills of the compiled kernels it launched; unknown in the
interpreter), pass DESIGN §4 (harness.check_rule against float64), and "split1" must really run the
single pass and leave split_sync_failures unchanged. Timing: harness.CudaTimer (CUDA graphs, inputs
rotated through >= 2x L2); GB/s count one read + one write, % of harness.measure_ceilings' copy.

Writes --out/sweep.json (every measurement) and sweep.md; --apply puts the rows that beat the "any"
row by >= 3% (the single pass: the default kernel) after the sm90 marker of TRITON_SOFTMAX,
replacing an earlier --apply block. On the H100 (16 CPU cores): ~530 timings of ~0.07 s and ~450
kernel compiles on the workers, ~100 s estimated; --budget (default 140 s after the imports) cuts
the timing short, lowest-priority shapes last, and what was measured is still written.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before any @triton.jit runs
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tiled_attn as ta  # noqa: E402
from benchmarks import harness as h  # noqa: E402
from benchmarks.suite_softmax import QUICK, SHAPES  # noqa: E402
from tiled_attn import _checks, configs  # noqa: E402
from tiled_attn.triton import softmax as ts  # noqa: E402

MIN_GAIN = 1.03  # below this a row is noise-level (run-to-run spread ~1-2%) and not applied
DRY_SHAPES = [dict(M=8, N=40), dict(M=8, N=1500), dict(M=2, N=3000)]  # row, online, split on "cpu"
# Elements per thread of a tile: fp32 16-32 (4-8 16-byte loads), bf16 16-64 (2-8 loads; a bf16
# tile of the fp32 size has half the bytes in flight, measured 86-88% of copy vs 92%).
EPT = {"fp32": (16, 32), "bf16": (16, 64)}
# "row" on short rows also tries small tiles (4 fp32 / 8 bf16 elements a thread, one 16-byte load):
# ncu on the H200 (2026-11-26, results/ncu) put 65536x128 fp32 at 92 registers and 31% occupancy
# on the 32x128 tile, and 2048 row blocks in ~3.1 waves, where torch's warp-per-row kernel holds 4
# elements a thread at 82% occupancy.
EPT_ROW = {"fp32": (4, 32), "bf16": (8, 64)}
SHORT_ROW = 1024  # the longest rows that get EPT_ROW's tiles
SWITCHES = {  # phase 2: crossed with the --top tiles of phase 1
    "row": [{"STAGES": 2}, {"EVICT": True}, {"WAVES": 0}, {"WAVES": 2},
            {"STAGES": 2, "EVICT": True}, {"EVICT": True, "WAVES": 0}],
    "online": [{"STAGES": 2}, {"STAGES": 3}, {"EVICT": True}, {"STAGES": 2, "EVICT": True},
               {"PROGRAMS_PER_SM": 2}],
    "split": [{"PROGRAMS_PER_SM": 2}, {"PROGRAMS_PER_SM": 8}, {"STAGES": 2}, {"EVICT": True}],
    # PREFETCH holds a second tile, STAGES - 1 more: under maxnreg=80 most tiles spill (ptxas).
    "split1": [{"PREFETCH": True}, {"PREFETCH": True, "maxnreg": 0}, {"EVICT": True},
               {"CHUNK_TILES": 2}, {"STAGES": 2, "maxnreg": 0}],
}
SYNC = "softmax_split_sync_kernel"
JIT = (ts.softmax_row_kernel, ts.softmax_online_kernel, ts.softmax_split_state_kernel,
       ts.softmax_split_normalize_kernel, ts.softmax_split_sync_kernel)


def log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------
# candidates
# ------------------------------------------------------------------------------------------------
def kernels_for(m: int, n: int, dt: str, arch: str, sms: int) -> tuple[str, list[str]]:
    """(the default kernel with the "any" rows, the kernels worth timing), as ts._choose decides."""
    rule = configs.triton_softmax_default(arch, dt)
    if n <= rule["row_max_n"]:
        return "row", ["row"]
    if m < rule["split_rows_per_sm"] * sms:
        return "split", ["split", "split1"]
    return "online", ["online", "split1"]  # "split" is timed once (its "any" row) for reference


def base_row(kernel: str, dt: str, n: int) -> dict:
    table = "split_sync" if kernel == "split1" else kernel
    row = dict(configs.triton_softmax_config(table, "any", dt, n))
    return {k: v for k, v in row.items() if k != "SINGLE_PASS"} if kernel == "split" else row


def tiles(kernel: str, dt: str, n: int, base: dict) -> list[dict]:
    """Phase 1: the tile (BLOCK_M rows for "row", else BLOCK_N columns) at 1/2-4x the "any" row's,
    warps at 1/2-2x, within EPT elements per thread; the "any" row itself is timed as phase 0.
    Offline (ptxas, sm_90a) a few of these spill (e.g. bf16 row 4x4096 at 32 warps: 64 registers
    a thread at most): the runtime spill check drops them before timing."""
    lo, hi = (EPT_ROW if kernel == "row" else EPT)[dt]
    field = "BLOCK_M" if kernel == "row" else "BLOCK_N"
    width = triton.next_power_of_2(n) if kernel == "row" else base.get("BLOCK_M", 1)
    # the small tiles of EPT_ROW (smaller factors too) on short rows only, where they were measured
    small = kernel == "row" and n <= SHORT_ROW
    if not small:
        lo = EPT[dt][0]
    out = []
    f0, w0 = base[field], base["num_warps"]
    for f in ((f0 // 8, f0 // 4) if small else ()) + (f0 // 2, f0, 2 * f0, 4 * f0):
        for w in ((w0 // 4,) if small else ()) + (w0 // 2, w0, 2 * w0):
            cand = dict(base, **{field: f, "num_warps": w})
            if f >= 1 and 1 <= w <= 32 and lo <= f * width / (32 * w) <= hi and cand != base:
                out.append(cand)
    if kernel == "split1":  # each uncapped too (maxnreg 0): bf16 at 64 a thread spills under 80
        out += [dict(c, maxnreg=0) for c in [base] + out]
    return out


def switched(kernel: str, tops: list[dict]) -> list[dict]:
    return [dict(t, **s) for t in tops for s in SWITCHES[kernel]]


def install_rows(kernel: str, dt: str, n: int, cfg: dict, arch: str) -> dict:
    """The table rows that make ta.softmax(kernel=...) run `cfg` for rows of n columns."""
    if kernel == "split1":
        return {("split", arch, dt, n): dict(base_row("split", dt, n), SINGLE_PASS=True),
                ("split_sync", arch, dt, n): cfg}
    return {(kernel, arch, dt, n): cfg}


def install(rows: dict, arch: str) -> None:
    for key in [k for k in configs.TRITON_SOFTMAX if k[1] == arch]:
        del configs.TRITON_SOFTMAX[key]
    configs.TRITON_SOFTMAX.update(rows)
    configs._TRITON_SOFTMAX_INDEX[:] = [frozenset(), {}]  # rebuilt at the next lookup


# ------------------------------------------------------------------------------------------------
# compile in parallel (workers), check, time
# ------------------------------------------------------------------------------------------------
def _precompile(job) -> str:
    """Worker: run one candidate once on the real shape, so its binaries land in Triton's cache."""
    dt, m, n, kernel, rows = job
    install(dict(rows), configs.arch(torch.device("cuda")))
    x = torch.randn(m, n, device="cuda").to(h.DTYPES[dt])
    try:
        ta.softmax(x, -1, backend="triton", kernel="split" if kernel == "split1" else kernel)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 -- reported again (candidate dropped) by the timing pass
        return f"{dt} {m}x{n} {kernel}: {type(e).__name__}: {str(e)[:160]}"


def precompile(pool, jobs: list, deadline: float) -> None:
    if pool is None or not jobs:
        return
    t0 = time.perf_counter()
    futures = [pool.submit(_precompile, j) for j in jobs]
    done, pending = cf.wait(futures, timeout=max(1.0, deadline - t0))
    for f in pending:
        f.cancel()
    errors = [f.exception() or f.result() for f in done]
    for e in [e for e in errors if e][:5]:
        log(f"  precompile: {e}")
    log(f"precompiled {len(done)}/{len(jobs)} candidates in {time.perf_counter() - t0:.0f} s")


def launched(fn):
    """fn()'s result and {kernel name: spilled registers} of the Triton kernels it launched (None in
    the interpreter, which launches nothing Triton compiled)."""
    if _checks.triton_interpret():
        return fn(), None
    handles = set()

    def hook(md):
        handles.add(getattr(md, "data", {}).get("function"))
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        out = fn()
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    found = {}
    try:
        for jit in JIT:
            for cache in jit.device_caches.values():
                for k in list(cache[0].values()):
                    k = k.result() if hasattr(k, "result") else k
                    if getattr(k, "function", None) in handles:
                        found[k.name] = max(found.get(k.name, 0), k.n_spills)
    except (AttributeError, IndexError, TypeError) as e:  # another Triton's internals: no check
        log(f"  cannot read the launched kernels' spills ({h._describe(e)}): not checked")
        return out, None
    return out, found


class Shape:
    """One (dtype, M, N) point: inputs, reference and torch's error via the harness, its kernels."""

    def __init__(self, dt, m, n, device, arch, timer, ceilings, seed):
        self.dt, self.m, self.n, self.device, self.arch, self.timer = dt, m, n, device, arch, timer
        self.copy = ceilings["copy_gbps"]
        sms = ts._sm_count(device, arch)
        self.default, self.kernels = kernels_for(m, n, dt, arch, sms)
        run = h.RunConfig(device=device, timer=timer, ceilings=ceilings)
        suite = h.Suite("sweep", "", h.SOFTMAX, device.type, [], [dt], [])
        self.case = dict(M=m, N=n, dtype=dt)
        self.data = h._CaseData(suite, self.case, run, seed)
        self.torch_ms = None

    def work(self) -> float:
        return h.SOFTMAX.work(self.case)

    def figures(self, ms: float) -> dict:
        gbps = self.work() / (ms * 1e-3) / 1e9
        return dict(ms=ms, gbps=gbps, pct_copy=100 * gbps / self.copy,
                    vs_torch=self.torch_ms / ms if self.torch_ms else None)

    def time_torch(self) -> None:
        sets = self.data.all_sets()
        self.torch_ms = self.timer.measure(lambda i: torch.softmax(sets[i % len(sets)][0], -1),
                                           len(sets)).ms

    def measure(self, kernel: str, cfg: dict, phase: int) -> dict:
        rows = install_rows(kernel, self.dt, self.n, cfg, self.arch)
        rec = dict(dtype=self.dt, M=self.m, N=self.n, kernel=kernel, phase=phase, any=phase == 0,
                   cfg=cfg, status="ok", error="")
        if kernel == "split1":
            rec["split_row"] = rows[("split", self.arch, self.dt, self.n)]
        install(rows, self.arch)
        fails = ts.split_sync_failures(self.device)
        try:
            rec.update(self._check_and_time(kernel))
        except Exception as e:  # noqa: BLE001 -- e.g. out of resources for this tile
            if not h._device_alive(self.device):
                raise h.DeviceLost(f"{self.dt} {self.m}x{self.n} {kernel} {cfg}: {e}") from e
            rec.update(status="error", error=h._describe(e))
        if kernel == "split1" and ts.split_sync_failures(self.device) != fails:
            rec.update(status="sync-failures", error="split_sync_failures grew: a wait timed out")
        return rec

    def _check_and_time(self, kernel: str) -> dict:
        call = "split" if kernel == "split1" else kernel
        ref, _, e_torch = self.data.reference()
        out, kernels = launched(lambda: ta.softmax(self.data.first()[0], -1, backend="triton",
                                                   kernel=call))
        res = dict(spills=None if kernels is None else sum(kernels.values()),
                   launched=None if kernels is None else sorted(kernels))
        if res["spills"]:
            return dict(res, status="spills", error=f"register spills {kernels}")
        if kernel == "split1" and "softmax_split_sync_kernel" not in (kernels or [SYNC]):
            return dict(res, status="fallback", error="ran the two-kernel split (did not fit)")
        check = h.check_rule(out, ref, e_torch, h.DTYPES[self.dt])
        res.update(e_ours=check.e_ours, e_torch=e_torch)
        if not check.ok:
            return dict(res, status="FAILED", error=check.message)
        del out
        sets = self.data.all_sets()
        t = self.timer.measure(lambda i: ta.softmax(sets[i % len(sets)][0], -1, backend="triton",
                                                    kernel=call), len(sets))
        return dict(res, **self.figures(t.ms), timing=t.mode + (f" ({t.note})" if t.note else ""))


def plan(shape: Shape, phase: int, records: list, top: int, limit: int | None) -> list:
    """[(kernel, cfg)] of a phase for a shape, leaving out configs it already measured."""
    out = []
    for k in shape.kernels + (["split"] if phase == 0 and shape.default == "online" else []):
        base = base_row(k, shape.dt, shape.n)
        mine = [r for r in records if (r["dtype"], r["N"], r["kernel"]) == (shape.dt, shape.n, k)]
        if phase == 0:
            cands = [base]
        elif phase == 1:
            cands = tiles(k, shape.dt, shape.n, base)
        else:
            ok = sorted((r for r in mine if r["status"] == "ok"), key=lambda r: r["ms"])
            cands = switched(k, [r["cfg"] for r in ok[:top]])
        seen = [r["cfg"] for r in mine]
        cands = [c for i, c in enumerate(cands) if c not in seen and c not in cands[:i]]
        out += [(k, c) for c in cands[:limit]]
    return out


# ------------------------------------------------------------------------------------------------
# picks and --apply
# ------------------------------------------------------------------------------------------------
def choose(doc: dict) -> tuple[dict, dict]:
    """({(table kernel, dtype, N): (row, note)} to apply, {(dtype, N): (kernel, ms) after it})."""
    picks, after = {}, {}
    ok = [r for r in doc["records"] if r["status"] == "ok"]
    for s in doc["shapes"]:
        dt, n, m = s["dtype"], s["N"], s["M"]
        best, any_ms, ships = {}, {}, {}
        for r in (r for r in ok if (r["dtype"], r["N"]) == (dt, n)):
            if r["any"]:
                any_ms[r["kernel"]] = r["ms"]
            if r["kernel"] not in best or r["ms"] < best[r["kernel"]]["ms"]:
                best[r["kernel"]] = r
        for k in ("row", "online", "split"):
            b = best.get(k)
            if k not in any_ms:
                continue
            ships[k] = any_ms[k]
            if not b["any"] and any_ms[k] >= MIN_GAIN * b["ms"]:
                gain = any_ms[k] / b["ms"]
                picks[(k, dt, n)] = (b["cfg"], f"{m}x{n}: {b['gbps']:.0f} GB/s = "
                                     f"{b['pct_copy']:.0f}% of copy, x{gain:.2f} vs any")
                ships[k] = b["ms"]
        d, b = s["default_kernel"], best.get("split1")
        if d not in ships:
            continue
        after[(dt, n)] = (d, ships[d])
        if b and any_ms.get(d, 0) >= MIN_GAIN * b["ms"] and b["ms"] < ships[d]:
            note = (f"{m}x{n} single pass: {b['gbps']:.0f} GB/s = {b['pct_copy']:.0f}% of copy, "
                    f"x{any_ms[d] / b['ms']:.2f} vs {d} on any")
            split = picks.get(("split", dt, n), (b["split_row"],))[0]
            picks[("split", dt, n)] = (dict(split, SINGLE_PASS=True), note)
            picks[("split_sync", dt, n)] = (b["cfg"], note)
            after[(dt, n)] = ("split1", b["ms"])
    return picks, after


BEGIN = "    # ---- sweep_triton_softmax.py --apply (begin)"
END = "    # ---- sweep_triton_softmax.py --apply (end)"
MARKER = "# ---- sm90: measured on the H100 by benchmarks/sweep_triton_softmax.py"


def _row_text(row: dict) -> str:
    return "dict(" + ", ".join(f"{k}={v!r}" for k, v in row.items()
                               if not (k == "maxnreg" and not v)) + ")"


def block_lines(doc: dict, cfg_mod) -> list[str]:
    """The rows --apply writes: the picks; below a table's largest picked class, the "any" row at
    every class of the "any" table or the sweep, so those sizes keep their launch (a table answers
    every N up to its largest class); fp16 takes the bf16 rows (same bytes, same loads)."""
    picks, _ = choose(doc)
    rows = dict(picks)
    for kernel, dt in {(k, d) for k, d, _ in picks if k != "split_sync"}:
        top = max(n for k, d, n in picks if (k, d) == (kernel, dt))
        classes = {key[3] for key in cfg_mod.TRITON_SOFTMAX if key[0] == kernel and key[1] == "any"
                   and key[2] in (dt, "any") and key[3] != float("inf")}
        classes |= {r["N"] for r in doc["records"] if r["dtype"] == dt and r["kernel"] == kernel}
        for c in sorted(c for c in classes if c < top and (kernel, dt, c) not in rows):
            rows[(kernel, dt, c)] = (cfg_mod.triton_softmax_config(kernel, "any", dt, c), "= any")
    for (k, d, n), (row, _) in list(rows.items()):
        if d == "bf16":
            rows[(k, "fp16", n)] = (row, "= bf16")
    meta = doc["meta"]
    lines = [BEGIN + f": {meta['date']}, {meta['device']}, copy {meta['copy_gbps']:.0f} GB/s.",
             '    # A row is here where it beat the "any" row by >= 3% on the ladder shape of',
             '    # its size class (the single pass: the default kernel); "= any" rows keep the',
             '    # smaller classes on the "any" launch; fp16 takes the bf16 rows. See sweep.json.']
    if not picks:
        lines.append("    # (no row beat the \"any\" rows by 3%)")
    order = ("row", "online", "split", "split_sync")
    for (k, d, n), (row, note) in sorted(rows.items(),
                                         key=lambda i: (order.index(i[0][0]), i[0][1:])):
        lines.append(f'    ("{k}", "sm90", "{d}", {n}): {_row_text(row)},  # {note}')
    return lines + [END]


LOOSE_ROW = re.compile(r'(?m)^ *(?P<key>\("(row|online|split|split_sync)", "sm90", "\w+", \w+\)).*\n')


def _row_keys(lines: list[str]) -> set[str]:
    return {m["key"] for m in map(LOOSE_ROW.match, (line + "\n" for line in lines)) if m}


def _load_configs(path: Path):
    spec = importlib.util.spec_from_file_location("_sweep_target_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def apply(sweep_json: Path, root: Path = ROOT, allow_any_arch: bool = False) -> list[str]:
    """Write the sweep's block after the sm90 marker of root/tiled_attn/configs.py (idempotent)."""
    doc = json.loads(Path(sweep_json).read_text())
    if doc["meta"]["arch"] != "sm90" and not allow_any_arch:
        raise SystemExit(f"{sweep_json} was measured on {doc['meta']['arch']}, not sm90")
    path = Path(root) / "tiled_attn" / "configs.py"
    lines = block_lines(doc, _load_configs(path))
    text = path.read_text()
    text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n", "", text, flags=re.S)
    # A hand-written sm90 row outside the block goes only where the block redefines its key (a dict
    # literal keeps the last duplicate silently); others (the open-ended _INF rows) stay.
    redefined = _row_keys(lines)
    text = LOOSE_ROW.sub(lambda m: "" if m["key"] in redefined else m[0], text)
    at = text.index(MARKER)
    at = text.index("\n", at) + 1
    while text[at:].startswith("    #"):  # the marker's comment continues
        at = text.index("\n", at) + 1
    path.write_text(text[:at] + "\n".join(lines) + "\n" + text[at:])
    return lines


# ------------------------------------------------------------------------------------------------
def markdown(doc: dict) -> str:
    _, after = choose(doc)
    meta = doc["meta"]
    out = [f"# Triton softmax sweep: {meta['device']} ({meta['arch']}), {meta['date']}",
           f"copy {meta['copy_gbps']:.0f} GB/s; {meta['seconds']:.0f} s; {meta['command']}", "",
           "| shape | dtype | default (any) | best | best config | after --apply | torch |",
           "|---|---|---|---|---|---|---|"]

    def fig(r):
        return f"{r['gbps']:.0f} GB/s {r['pct_copy']:.0f}% x{r['vs_torch'] or 0:.2f}" if r else "-"
    for s in doc["shapes"]:
        recs = [r for r in doc["records"] if (r["dtype"], r["N"]) == (s["dtype"], s["N"])]
        ok = [r for r in recs if r["status"] == "ok"]
        dflt = next((r for r in ok if r["any"] and r["kernel"] == s["default_kernel"]), None)
        best = min(ok, key=lambda r: r["ms"], default=None)
        k, ms = after.get((s["dtype"], s["N"]), (None, None))
        cfg = f"{best['kernel']} {_row_text(best['cfg'])}" if best else "-"
        torch_gbps = s["torch_gbps"] or 0
        gain = dflt["ms"] / ms if dflt and ms else 0
        out.append(f"| {s['M']}x{s['N']} | {s['dtype']} | {s['default_kernel']} {fig(dflt)} | "
                   f"{fig(best)} | {cfg} | {k} x{gain:.2f} | "
                   f"{torch_gbps:.0f} GB/s {100 * torch_gbps / meta['copy_gbps']:.0f}% |")
    bad = [r for r in doc["records"] if r["status"] not in ("ok", "skipped")]
    out += ["", f"{len(doc['records'])} records, {len(bad)} rejected:"]
    out += [f"- {r['dtype']} {r['M']}x{r['N']} {r['kernel']} {r['status']}: {r['error']} {r['cfg']}"
            for r in bad]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for sweep.json and sweep.md")
    ap.add_argument("--apply", type=Path, metavar="SWEEP_JSON", help="its picks -> configs.py")
    ap.add_argument("--quick", action="store_true", help="3 ladder shapes, top 1")
    ap.add_argument("--shapes", help="MxN[,MxN...] instead of the ladder, e.g. 65536x128")
    ap.add_argument("--dtypes", default="bf16,fp32", help="of bf16,fp32")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes")
    ap.add_argument("--budget", type=float, default=140.0, help="seconds for the run")
    ap.add_argument("--top", type=int, default=2, help="phase-1 tiles crossed with the switches")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile procs")
    args = ap.parse_args(argv)
    if args.apply:
        log("\n".join(apply(args.apply)))
        log("now: python -m pytest -q tests/test_softmax.py -k sm90a (the new rows must not spill)")
        return 0
    if args.out is None:
        ap.error("--out is required (or --apply SWEEP_JSON)")
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        raise SystemExit("the sweep needs a CUDA device (or --dry-run on the CPU)")
    device = torch.device("cpu" if dry else "cuda")
    arch = configs.arch(device)
    timer = h.CpuTimer(0, 1, 1) if dry else h.CudaTimer(warmup_ms=2.0, rep_ms=12.0)
    top, limit = (1, 2) if dry else (1 if args.quick else args.top, None)
    saved = dict(configs.TRITON_SOFTMAX)
    pool = None if dry or args.jobs <= 1 else cf.ProcessPoolExecutor(
        args.jobs, mp_context=mp.get_context("spawn"), initializer=torch.cuda.init)
    ceilings = h.measure_ceilings(device, timer)
    log(f"{torch.cuda.get_device_name() if not dry else 'cpu'} ({arch}): copy "
        f"{ceilings['copy_gbps']:.0f} GB/s, torch {torch.__version__}, triton {triton.__version__}")
    ladder = DRY_SHAPES if dry else QUICK if args.quick else SHAPES
    if args.shapes:
        ladder = [dict(M=int(a), N=int(b)) for a, b in (t.split("x") for t in args.shapes.split(","))]
    dts = [d for d in ("bf16", "fp32") if d in args.dtypes.split(",")]
    shapes = [Shape(dt, s["M"], s["N"], device, arch, timer, ceilings, 1000 * i + j)
              for i, s in enumerate(ladder) for j, dt in enumerate(dts)]
    # Order = priority under --budget: furthest below the bar first (long rows, then bf16 rows).
    shapes.sort(key=lambda s: (s.n <= 32768, s.n <= 32768 and s.dt == "fp32", -s.n))
    records, aborted = [], ""
    try:
        for phase in (0, 1, 2):
            todo = [(s, k, c) for s in shapes for k, c in plan(s, phase, records, top, limit)]
            if phase == 2 and time.perf_counter() > deadline - 10:
                todo = []
            precompile(pool, [(s.dt, s.m, s.n, k, list(install_rows(k, s.dt, s.n, c, arch).items()))
                              for s, k, c in todo], deadline - 5)
            for s, k, c in todo:
                if time.perf_counter() > deadline:
                    records.append(dict(dtype=s.dt, M=s.m, N=s.n, kernel=k, phase=phase, any=False,
                                        cfg=c, status="skipped", error="--budget reached"))
                    continue
                if phase == 0 and s.torch_ms is None:
                    s.time_torch()
                records.append(s.measure(k, c, phase))
                r = records[-1]
                what = (f"{r['gbps']:.0f} GB/s {r['pct_copy']:.0f}%" if r["status"] == "ok"
                        else r["error"])
                log(f"{time.perf_counter() - t0:5.0f}s {s.dt} {s.m}x{s.n} {k} p{phase} "
                    f"{r['status']} {what} {_row_text(c)}")
    except Exception as e:  # noqa: BLE001 -- a lost device (or a bug): still write what was timed
        aborted = h._describe(e)
        log(f"ABORTED: {aborted}")
    finally:
        install({}, arch)
        configs.TRITON_SOFTMAX.update(saved)
        if pool:
            pool.shutdown(cancel_futures=True)
    meta = dict(device=torch.cuda.get_device_name() if not dry else "cpu (dry run)", arch=arch,
                date=time.strftime("%Y-%m-%d"), torch=torch.__version__, triton=triton.__version__,
                copy_gbps=ceilings["copy_gbps"], seconds=time.perf_counter() - t0, aborted=aborted,
                command=" ".join(["benchmarks/sweep_triton_softmax.py"] + (argv or sys.argv[1:])))
    doc = dict(meta=meta, records=records, shapes=[
        dict(dtype=s.dt, M=s.m, N=s.n, default_kernel=s.default, torch_ms=s.torch_ms,
             torch_gbps=s.figures(s.torch_ms)["gbps"] if s.torch_ms else None) for s in shapes])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps(doc, indent=1))
    (args.out / "sweep.md").write_text(markdown(doc))
    log(markdown(doc))
    log("rows --apply would write:\n" + "\n".join(block_lines(doc, configs)))
    log(f"wrote {args.out}/sweep.json and sweep.md ({meta['seconds']:.0f} s)")
    bad = [r for r in records if r["status"] in ("FAILED", "sync-failures")]
    return 1 if aborted or bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
