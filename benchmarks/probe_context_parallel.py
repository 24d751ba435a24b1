"""Where a context-parallel call's time goes (issue 17): the forward ring's merge A/B and a kernel
profile of one call on every rank, one GPU per rank (NCCL).

    python benchmarks/probe_context_parallel.py --n 131072 --worlds 1,2,4 --out DIR [--ab] [--profile]

Per world size W (one spawned NCCL group each; W = 1 is ta.attention on the whole sequence, the
scaling baseline), B = 1, --heads heads of D = --dim, causal, bf16, zigzag shards:
* timing: forward and forward+backward, ms per call from CUDA events over back-to-back calls after a
  warm-up, the slowest rank's (the suite's own timing, context_parallel._time); with --ab, for the forward ring's merges through the fused Triton
  kernel and through the torch form (distributed._FUSED_MERGE), interleaved, 3 rounds.
* --profile: torch.profiler (CUPTI) over one forward+backward call per rank after the warm-up
  (--profile-fwd K: after K forwards back to back, as a timing loop runs them);
  each rank's kernels by kind (attention forward, attention backward, the merge kernel, NCCL, other:
  the torch elementwise ops, copies and fills), the call's span (first kernel start to last kernel
  end), how much of the NCCL kernels' time some compute kernel overlaps (the ring hides its
  transfers when that is all of it), and the compute streams' idle time inside the span. The
  Chrome traces are written beside the summary (trace-W{W}-r{rank}.json).
* --kernels L1,L2: on GPU 0 alone (no group), the blocks a ring step runs at local length L (the
  own step: causal L×L; another rank's step: L/2 queries × L keys or L × L/2, not causal, the same
  FLOPs), forward and backward timed apart, TFLOP/s each (forward 4·H·nq·nk·D, halved when causal;
  backward 2.5× that). The ring's scaling leans on the two running alike.
* --ncu-block {causal,rect}: run that block's backward twice at the first --kernels length and
  exit (for ncu --launch-skip to profile the second call's kernels).
Writes DIR/probe-context-parallel.json and .txt (the summary, also printed).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.context_parallel import _free_port, _time  # noqa: E402


def _kind(name: str) -> str:
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if "merge_outputs" in low:
        return "merge"
    if "bwd" in low or "backward" in low:
        return "attn bwd" if ("attn" in low or "attention" in low) else "other"
    if "attn" in low or "attention" in low or "fwd" in low:
        return "attn fwd"
    return "other"


def _union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _measure(iv) -> float:
    return sum(e - s for s, e in iv)


def _intersect(a, b) -> float:
    """Total length of the intersection of two unions of intervals."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        tot += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def summarize_trace(path: str) -> dict:
    """Kernel time by kind, the span, NCCL time overlapped by compute, compute idle (µs)."""
    events = json.load(open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        return {"error": "no kernel events in the trace"}
    by_kind: dict = {}
    names: dict = {}
    comm, compute = [], []
    for e in kernels:
        k = _kind(e["name"])
        by_kind[k] = by_kind.get(k, 0.0) + e["dur"]
        short = e["name"][:60]
        names[short] = names.get(short, 0.0) + e["dur"]
        (comm if k == "nccl" else compute).append((e["ts"], e["ts"] + e["dur"]))
    span0 = min(s for s, _ in comm + compute)
    span1 = max(e for _, e in comm + compute)
    cu, co = _union(compute), _union(comm)
    nccl = _measure(co)
    hidden = _intersect(cu, co)
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return {"span_us": span1 - span0, "kernel_us_by_kind": by_kind, "compute_busy_us": _measure(cu),
            "compute_idle_us": (span1 - span0) - _measure(cu), "nccl_us": nccl, "nccl_hidden_us": hidden,
            "nccl_hidden_frac": hidden / nccl if nccl else None, "top_kernels_us": top}


def _worker(rank: int, world: int, port: int, spec: dict) -> None:
    import torch.distributed as dist

    import tiled_attn as ta
    from tiled_attn import distributed as D
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300), device_id=torch.device("cuda", rank))
    try:
        n, h, d = spec["n"], spec["heads"], spec["dim"]
        gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
        q, k, v = (torch.randn((1, h, n // world, d), generator=gen, device="cuda", dtype=torch.bfloat16)
                   .requires_grad_() for _ in range(3))
        go = torch.randn_like(q)

        def fwd():
            with torch.no_grad():
                D.context_parallel_attention(q, k, v, causal=True, strategy="ring")

        def fwd_bwd():
            out = D.context_parallel_attention(q, k, v, causal=True, strategy="ring")
            q.grad = k.grad = v.grad = None
            out.backward(go)

        # variant -> (distributed._FUSED_MERGE, distributed._HIGH_PRIORITY_RING); each variant is its
        # own call signature, so its own plan (a twin group is made at the first high-priority one)
        variants = {"fused": (None, True)}
        if spec["ab"] and world > 1:
            variants["torch"] = (False, True)
        if spec["ab_priority"] and world > 1:
            variants["lowprio"] = (None, False)
        rows = []
        for rnd in range(spec["rounds"]):
            # the variants' order rotates by round: a GPU warming up over a run (seen on 4 H200s: a
            # round's first variant ran faster) must not favour the one that always runs first
            order = list(variants.items())
            order = order[rnd % len(order):] + order[:rnd % len(order)]
            for name, (fused, high) in order:
                D._FUSED_MERGE, D._HIGH_PRIORITY_RING = fused, high
                D._SIGNATURES.clear()  # the ring's group is fixed at plan time
                for pass_, call in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                    rows.append(dict(world=world, n=n, merge=name, pass_=pass_, round=rnd, ms=_time(call, spec["repeat_s"], dist)))
        D._FUSED_MERGE, D._HIGH_PRIORITY_RING = None, True
        D._SIGNATURES.clear()
        prof = None
        if spec["profile"]:
            from torch.profiler import ProfilerActivity, profile
            fwd_bwd()
            torch.cuda.synchronize()
            dist.barrier()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                # --profile-fwd K: K forwards back to back first, the steady state a timing loop sees
                # (one call after a barrier starts the ranks together, which back-to-back calls do not)
                for _ in range(spec["profile_fwd"]):
                    fwd()
                fwd_bwd()
                torch.cuda.synchronize()
            path = os.path.join(spec["dir"], f"trace-W{world}-r{rank}.json")
            p.export_chrome_trace(path)
            prof = dict(world=world, rank=rank, **summarize_trace(path))
        got = [None] * world
        dist.all_gather_object(got, prof)
        if rank == 0:
            with open(spec["out"], "w") as f:
                json.dump({"rows": rows, "profiles": [g for g in got if g]}, f)
    finally:
        dist.destroy_process_group()


def _blocks(local: int):
    """(name, nq, nk, causal) of a zigzag ring step's calls at local length `local`."""
    return [("own causal", local, local, True), ("rect L/2 x L", local // 2, local, False),
            ("rect L x L/2", local, local // 2, False)]


def _block_inputs(nq: int, nk: int, heads: int, dim: int):
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn((1, heads, nq, dim), generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k, v = (torch.randn((1, heads, nk, dim), generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for _ in range(2))
    return q, k, v


def kernel_rates(locals_, heads: int, dim: int) -> list[dict]:
    import tiled_attn as ta
    rows = []
    for local in locals_:
        for name, nq, nk, causal in _blocks(local):
            q, k, v = _block_inputs(nq, nk, heads, dim)
            flops = 4 * heads * nq * nk * dim * (0.5 if causal else 1.0)
            out = ta.attention(q, k, v, causal=causal)
            go = torch.randn_like(out)

            def fwd():
                with torch.no_grad():
                    ta.attention(q, k, v, causal=causal)

            def bwd():
                torch.autograd.grad(out, (q, k, v), go, retain_graph=True)
            got = dict(local=local, block=name, nq=nq, nk=nk, causal=causal)
            for what, call, f in (("fwd", fwd, flops), ("bwd", bwd, 2.5 * flops)):
                call()
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(3):
                    call()
                b.record()
                torch.cuda.synchronize()
                ms = a.elapsed_time(b) / 3
                got[f"{what}_ms"], got[f"{what}_tflops"] = ms, f / ms / 1e9
            rows.append(got)
    return rows


def main(argv=None) -> None:
    import torch.multiprocessing as mp
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ab", action="store_true")
    ap.add_argument("--ab-priority", action="store_true",
                    help="also time the ring with its transfers on the caller's group as it is (normal-priority "
                         "NCCL streams), the 'lowprio' rows; the default rows use the high-priority twin")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-fwd", type=int, default=0, help="forwards profiled back to back before the fwd+bwd")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--repeat-s", type=float, default=0.5)
    ap.add_argument("--kernels", default="", help="local lengths, e.g. 32768,65536")
    ap.add_argument("--ncu-block", choices=("causal", "rect"), default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    locals_ = [int(x) for x in args.kernels.split(",") if x]
    if args.ncu_block:
        _, nq, nk, causal = _blocks(locals_[0])[0 if args.ncu_block == "causal" else 1]
        import tiled_attn as ta
        q, k, v = _block_inputs(nq, nk, args.heads, args.dim)
        for _ in range(2):
            out = ta.attention(q, k, v, causal=causal)
            out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
        return
    result = {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "n": args.n,
              "heads": args.heads, "dim": args.dim, "command": " ".join(sys.argv), "rows": [], "profiles": [],
              "kernels": kernel_rates(locals_, args.heads, args.dim) if locals_ else []}
    for world in (int(w) for w in args.worlds.split(",") if w):
        if world > torch.cuda.device_count():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            spec = dict(n=args.n, heads=args.heads, dim=args.dim, ab=args.ab, ab_priority=args.ab_priority,
                        profile=args.profile,
                        profile_fwd=args.profile_fwd,
                        rounds=args.rounds or (3 if args.ab or args.ab_priority else 1), repeat_s=args.repeat_s,
                        dir=str(args.out),
                        out=os.path.join(tmp, "rows.json"))
            mp.start_processes(_worker, args=(world, _free_port(), spec), nprocs=world, start_method="spawn")
            got = json.load(open(spec["out"]))
        result["rows"] += got["rows"]
        result["profiles"] += got["profiles"]
    (args.out / "probe-context-parallel.json").write_text(json.dumps(result, indent=1))
    text = _text(result)
    (args.out / "probe-context-parallel.txt").write_text(text)
    print(text)


def _text(result: dict) -> str:
    import statistics
    lines = [f"{result['device']} x{result['gpus']}: N={result['n']} H={result['heads']} D={result['dim']} causal "
             f"bf16 zigzag ring; {result['command']}", "", "ms per call (slowest rank; median of rounds), "
             "scaling efficiency vs W=1"]
    med: dict = {}
    for r in result["rows"]:
        med.setdefault((r["world"], r["merge"], r["pass_"]), []).append(r["ms"])
    base = {p: statistics.median(v) for (w, m, p), v in med.items() if w == 1}
    for (w, m, p), v in sorted(med.items()):
        ms = statistics.median(v)
        eff = base[p] / (w * ms) if p in base else None
        lines.append(f"  W={w} merge={m:6s} {p:8s} {ms:9.2f} ms  rounds {['%.2f' % x for x in v]}"
                     + ("" if eff is None else f"  efficiency {eff:.1%}"))
    if result.get("kernels"):
        lines += ["", "one GPU, a ring step's blocks alone (bf16, B=1):"]
        for r in result["kernels"]:
            lines.append(f"  L={r['local'] // 1024}k {r['block']:13s} {r['nq']:>6}x{r['nk']:<6} fwd {r['fwd_ms']:7.2f} ms "
                         f"{r['fwd_tflops']:5.0f} TFLOP/s   bwd {r['bwd_ms']:7.2f} ms {r['bwd_tflops']:5.0f} TFLOP/s")
    for pr in result["profiles"]:
        if "error" in pr:
            lines.append(f"W={pr['world']} rank {pr['rank']}: {pr['error']}")
            continue
        kinds = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(pr["kernel_us_by_kind"].items()))
        frac = pr["nccl_hidden_frac"]
        lines += ["", f"W={pr['world']} rank {pr['rank']}: the profiled calls span {pr['span_us'] / 1e3:.2f} ms; kernels (ms): "
                  f"{kinds}; compute busy {pr['compute_busy_us'] / 1e3:.2f}, idle {pr['compute_idle_us'] / 1e3:.2f}; "
                  f"NCCL {pr['nccl_us'] / 1e3:.2f} ms, {'' if frac is None else f'{frac:.1%}'} of it under compute"]
        lines += [f"    {us / 1e3:8.2f} ms  {name}" for name, us in pr["top_kernels_us"][:8]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
