"""`python -m benchmarks` (or `tiled-attn-bench`): the one-command benchmark against torch.

On a CUDA machine: measures the ceilings (copy bandwidth, bf16 matmul rate), then runs the GPU
suites (softmax ladder, softmax backward, decode, varlen, KV cache, attention grid, attention
backward, end to end), each provider checked before it is timed, and writes
<out>/<date>-<device>.{json,md} and one PNG per suite. On a CPU-only machine it runs the small CPU
suite (torch backend, Triton interpreter at tiny sizes) instead.

    python -m benchmarks                          # everything this machine can run
    python -m benchmarks --quick --suite softmax  # fewer shapes, shorter timing
    python -m benchmarks --list                   # what would run, without running it
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path

# Attention runs last: it is the longest (one FlexAttention compile per shape), so a run that
# reaches its budget loses the fewest suites.
# overhead first (seconds), e2e last (minutes, the model pairs); context_parallel after it (one
# process group per world size; with fewer than 2 GPUs it reports skipped at once).
GPU_SUITES = ("overhead", "softmax", "softmax_random", "softmax_backward", "decode", "varlen", "kvcache",
              "attention", "attention_backward", "e2e", "context_parallel")
ALIASES = {"softmax-backward": "softmax_backward", "attention-backward": "attention_backward", "backward": "softmax_backward",
           "bwd": "softmax_backward", "fwd": "softmax", "cp": "context_parallel", "gpu": ",".join(GPU_SUITES)}
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", default=[],
                    help=f"suite(s) to run, repeatable or comma-separated: {', '.join(GPU_SUITES)}, "
                         "cpu, gpu (default: the GPU suites on a CUDA machine, else cpu)")
    ap.add_argument("--dtype", default=None,
                    help="comma list replacing each suite's dtypes (fp32, bf16, fp16)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and shorter timing")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory ({DEFAULT_OUT})")
    ap.add_argument("--providers", default=None,
                    help="comma list of globs on provider names, e.g. 'triton*,torch.softmax'")
    ap.add_argument("--time-cap", type=float, default=None,
                    help="seconds per suite; cases past it are recorded as skipped")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run (default 540 on a GPU, none on the CPU); "
                         "each suite's cap shrinks to what is left")
    ap.add_argument("--timing", choices=("eager", "events", "graph"), default="eager",
                    help="GPU timing: 'eager' (default, DESIGN §6): per-call CUDA events over "
                         "back-to-back calls, what a user's call gets, host cost included, as the "
                         "headline, and CUDA-graph replays (kernel time) as a second column; "
                         "'events': the eager figure only; 'graph': graph replays only")
    ap.add_argument("--warmup-ms", type=float, default=None)
    ap.add_argument("--rep-ms", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=None,
                    help="eager rounds per point, providers in turn (default 3, 1 with --quick); the "
                         "headline is their median")
    ap.add_argument("--seed", type=int, default=None, help="base seed (default: fresh)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--list", action="store_true", help="list suites, cases and providers; run nothing")
    return ap.parse_args(argv)


def _suite_names(args, cuda: bool) -> list[str]:
    names = []
    for item in args.suite:
        for n in item.split(","):
            n = n.strip()
            if n:
                names += ALIASES.get(n, n).split(",")
    if not names:
        names = list(GPU_SUITES) if cuda else ["cpu"]
    bad = [n for n in names if n not in GPU_SUITES + ("cpu",)]
    if bad:
        raise SystemExit(f"--suite: unknown suite(s) {bad}; choose from "
                         f"{', '.join(GPU_SUITES + ('cpu', 'gpu'))}")
    return list(dict.fromkeys(names))


def _load_suites(names: list[str]) -> list:
    from . import (suite_attention, suite_attention_backward, suite_context_parallel, suite_cpu, suite_decode,
                   suite_e2e, suite_kvcache, suite_overhead, suite_softmax, suite_softmax_backward,
                   suite_softmax_random, suite_varlen)
    modules = {"softmax": [suite_softmax.SUITE], "softmax_backward": [suite_softmax_backward.SUITE],
               "softmax_random": [suite_softmax_random.SUITE],
               "attention": [suite_attention.SUITE], "decode": [suite_decode.SUITE],
               "varlen": [suite_varlen.SUITE], "kvcache": [suite_kvcache.SUITE],
               "attention_backward": [suite_attention_backward.SUITE],
               "overhead": [suite_overhead.SUITE], "e2e": [suite_e2e.SUITE],
               "context_parallel": [suite_context_parallel.SUITE], "cpu": suite_cpu.SUITES}
    return [s for n in names for s in modules[n]]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def _versions() -> dict:
    import torch
    try:
        import triton
        triton_v = triton.__version__
    except Exception:
        triton_v = "n/a"
    return {"torch": torch.__version__, "triton": triton_v, "cuda": torch.version.cuda or "n/a",
            "python": platform.python_version()}


def _device_meta(device) -> dict:
    import torch
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        return {"device_name": name, "capability": f"sm{major}{minor}"}
    return {"device_name": f"CPU ({platform.processor() or platform.machine()}, "
                           f"{os.cpu_count()} cores)", "capability": "cpu"}


def _timing_note(mode: str, warmup: float, rep: float, rounds: int = 1) -> str:
    how = {"graph": "CUDA-graph replays of the calls (kernel time; per-call CUDA events where a "
                    "provider cannot be captured, marked per row)",
           "events": "per-call CUDA events over back-to-back eager calls (host cost included)",
           "eager": "per-call CUDA events over back-to-back eager calls (host cost included: what a "
                    "user's call gets) as the headline; CUDA-graph replays of the same calls (kernel "
                    "time) as the second column (graph_ms in the JSON)"}[mode]
    if mode != "graph" and rounds > 1:
        how += (f"; the eager figure is the median of {rounds} rounds, every provider of a point "
                "timed in turn in each, every other round in reverse order (the host's and the clock's drift "
                "shared alike; all rounds in eager_rounds_ms)")
    return (f"median; GPU: {how}, warm-up {warmup:g} ms, {rep:g} ms of repeats per point, input "
            "sets rotating through >= 2x L2; CPU: perf_counter per call. Each provider is checked "
            "(DESIGN §4 rule against a float64 reference, float32 for attention cases over 2^30 "
            "score elements) before it is timed; a wrong one is FAILED and not timed.")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    cuda = torch.cuda.is_available()
    names = _suite_names(args, cuda)
    from . import report
    console = report.make_console()
    if not cuda and any(n in GPU_SUITES for n in names):
        report.say(console, "The GPU suites (" + ", ".join(n for n in names if n in GPU_SUITES)
                   + ") need a CUDA GPU; this machine has none, so they are not run. "
                   "`python -m benchmarks` on a CPU-only machine runs the small CPU suite.")
        names = [n for n in names if n not in GPU_SUITES]
        if not names:
            return 2
    # The Triton interpreter must be chosen before any @triton.jit kernel is defined (the
    # kernel modules are imported lazily, on first use); restored on exit.
    old_interp = os.environ.get("TRITON_INTERPRET")
    if "cpu" in names and not cuda and old_interp in (None, "", "0"):
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        return _run(args, names, cuda, console)
    finally:
        if old_interp is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old_interp


def _run(args, names, cuda, console) -> int:
    import torch

    from . import harness, report
    suites = _load_suites(names)
    dtypes = [d.strip() for d in args.dtype.split(",")] if args.dtype else None
    if dtypes and any(d not in harness.DTYPES for d in dtypes):
        raise SystemExit(f"--dtype: choose from {', '.join(harness.DTYPES)}, got {args.dtype!r}")
    globs = [g.strip() for g in args.providers.split(",")] if args.providers else None
    pfilter = (lambda n: any(fnmatch.fnmatchcase(n, g) for g in globs)) if globs else None

    if args.list:
        for s in suites:
            if hasattr(s, "run"):  # a suite with its own runner (overhead, e2e)
                report.say(console, f"{s.name}: {s.title}\n  cases: {s.describe(args.quick)}")
                continue
            dev = torch.device("cuda" if s.device == "cuda" and cuda else "cpu")
            provs = [n + (f" (unavailable: {r})" if r else "")
                     for _, n, r in harness.expand_providers(s, dev) if not pfilter or pfilter(n)]
            report.say(console, f"{s.name}: {s.title}\n  cases: "
                       + "; ".join(s.op.label(c) for c in s.cases(args.quick, dtypes))
                       + "\n  providers: " + ", ".join(provs))
        return 0

    quick = args.quick
    warmup = args.warmup_ms if args.warmup_ms is not None else (2.0 if quick else 5.0)
    rep = args.rep_ms if args.rep_ms is not None else (10.0 if quick else 30.0)
    rounds = max(1, args.rounds if args.rounds is not None else (1 if quick else 3))
    budget = args.budget if args.budget is not None else (540.0 if cuda else None)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFF
    t_start = time.perf_counter()

    def timer_for(dev):
        if dev.type == "cuda":
            return harness.CudaTimer(warmup, rep, graphs=args.timing != "events",
                                     eager_first=args.timing != "graph", rounds=rounds)
        return harness.CpuTimer(warmup_ms=4 * warmup, rep_ms=(50.0 if quick else 200.0))

    primary = torch.device("cuda" if cuda and any(s.device == "cuda" for s in suites) else "cpu")
    meta = {"date": time.strftime("%Y-%m-%d"), **_device_meta(primary), **_versions(),
            "command": shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv)),
            "seed": seed, "quick": quick,
            "timing": _timing_note(args.timing, warmup, rep, rounds)}
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{meta['date']}-{_slug(meta['device_name'] if primary.type == 'cuda' else 'cpu')}"
    default = list(GPU_SUITES) if cuda else ["cpu"]
    if sorted(names) != sorted(default):  # a partial run never overwrites the full run's files
        stem += "-" + "_".join(names)
    if quick:
        stem += "-quick"
    run = {"meta": meta, "ceilings": {}, "suites": []}
    report.say(console, f"tiled_attn benchmarks on {meta['device_name']}: torch {meta['torch']}, "
               f"triton {meta['triton']}, seed {seed}; suites: {', '.join(s.name for s in suites)}")
    if not cuda:
        report.say(console, "No CUDA GPU: running the CPU suite only (the GPU suites need a GPU). "
                   "Triton kernels run in the interpreter (TRITON_INTERPRET=1) at tiny sizes.")

    ceilings_by_dev: dict = {}  # device type -> ceilings measured on it
    plots: dict = {}
    any_failed = False
    for suite in suites:
        dev = torch.device("cuda" if suite.device == "cuda" else "cpu")
        if dev.type not in ceilings_by_dev:
            t0 = time.perf_counter()
            ceil_timer = (harness.CudaTimer(5.0, 50.0, graphs=False) if dev.type == "cuda"
                          else harness.CpuTimer(20.0, 200.0))
            ceilings_by_dev[dev.type] = harness.measure_ceilings(dev, ceil_timer)
            c = ceilings_by_dev[dev.type]
            report.say(console, f"ceilings ({dev.type}, {time.perf_counter() - t0:.1f} s): copy "
                       f"{c['copy_gbps']:.0f} GB/s ({c['copy_note']}); matmul "
                       f"{c['matmul_tflops']:.1f} TFLOP/s ({c['matmul_note']})")
            run["ceilings"] = ceilings_by_dev
        cap = args.time_cap
        if budget is not None:
            left = budget - (time.perf_counter() - t_start)
            cap = left if cap is None else min(cap, left)
            cap = max(cap, 1.0)
        cfg = harness.RunConfig(device=dev, timer=timer_for(dev), ceilings=ceilings_by_dev[dev.type],
                                seed=seed, quick=quick, dtypes=dtypes, provider_filter=pfilter,
                                time_cap_s=cap, progress=report.progress_factory(console))
        if hasattr(suite, "run"):  # its own runner (overhead, e2e): the same record format
            try:
                result = suite.run(cfg)
            except Exception as err:  # noqa: BLE001 -- a suite that breaks must not cost the others
                result = {"name": suite.name, "title": suite.title, "device": suite.device, "unit": "",
                          "ceiling": None, "convention": "", "notes": "", "baselines": [], "plot": {},
                          "elapsed_s": 0.0, "capped": False, "device_lost": "",
                          "records": [dict(suite=suite.name, label="(suite)", provider="(suite)",
                                           role="ours", status=harness.ERROR,
                                           error=f"{type(err).__name__}: {err}"[:400])]}
        else:
            result = harness.run_suite(suite, cfg)
        result["ceilings"] = ceilings_by_dev[dev.type]
        run["suites"].append(result)
        any_failed |= any(r["status"] == harness.FAILED for r in result["records"])
        report.print_suite(console, result)
        if not args.no_plots:
            try:
                png = report.plot_suite(result, result["ceilings"], out_dir / f"{stem}-{suite.name}.png")
                if png:
                    plots[suite.name] = png.name
            except Exception as err:  # a plot must never cost the measured numbers
                report.say(console, f"plot for {suite.name} failed: {type(err).__name__}: {err}")
        # Written after every suite: a run cut short still leaves its finished suites on disk.
        report.write_json(run, out_dir / f"{stem}.json")
        report.write_markdown(run, out_dir / f"{stem}.md", plots)
        if result["device_lost"]:
            report.say(console, f"The device was lost ({result['device_lost']}); stopping here.")
            break

    report.say(console, "")
    for s in run["suites"]:
        report.say(console, report.summary(s))
    report.say(console, f"total {time.perf_counter() - t_start:.1f} s; wrote {out_dir / stem}.json, "
               f".md and {len(plots)} plot(s)")
    if any_failed:
        report.say(console, "Some providers gave WRONG results (FAILED rows above); exit status 1.")
    if any(s["device_lost"] for s in run["suites"]):
        return 3
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
