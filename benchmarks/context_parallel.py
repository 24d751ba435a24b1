"""The context-parallel benchmark (issue 17; declared in benchmarks/suite_context_parallel.py): tokens/s
of ta.distributed.context_parallel_attention on 1 to 8 GPUs of one host, its scaling efficiency
against one GPU, and the ratio to torch's own context parallelism
(torch.distributed.tensor.experimental.context_parallel around F.scaled_dot_product_attention).

The harness runs one process; this suite needs one process per GPU, so its runner spawns them itself
(torch.multiprocessing, NCCL over 127.0.0.1), one process group per world size, and collects rank
0's figures: python -m benchmarks --suite context_parallel [--quick]. With fewer than two GPUs it
records one `skipped` row saying so and spawns nothing.

Per world size W and global length N (B = 1, causal, bf16): each rank holds N/W tokens in the zigzag
layout; a provider's time is the slowest rank's, per call, from CUDA events over back-to-back calls
after a warm-up (the repeat count is agreed by all ranks), forward and forward+backward. Tokens/s =
N / time. Scaling efficiency = tokens/s at W / (W × tokens/s of ta.attention on the whole sequence on
one GPU). Before timing, at the smallest N, our providers' outputs are compared with the one-GPU
ta.attention of the whole sequence (a sanity check, max |diff| <= 4 bf16 ulps of max |out|; the
numerics rule is tests/test_distributed.py's); one that fails is FAILED and not timed. torch's CP is
timed unchecked: its output is sharded by its own load balancer's layout (on the H100 and H200 its
SDPA is cuDNN: torch 2.11's CP dispatches _scaled_dot_product_cudnn_attention). Every rank takes the
timing decisions (a second warm-up call, the repeat count, the time cap) from the slowest rank's
figures, so no rank enters a collective the others skip. Run on 4 H100s: benchmarks/results/
2026-11-27-h100x4-context_parallel-{quick,cut}.md; on 4 H200s: 2026-11-28-h200x4-context_parallel-{a,b}.md.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import torch

from . import harness as h

RING, ALLGATHER, ONE_GPU, TORCH_CP, SDPA = ("tiled_attn ring", "tiled_attn allgather", "ta.attention (1 GPU)",
                                            "torch CP (SDPA)", "SDPA (1 GPU)")
PASSES = ("fwd", "fwd+bwd")
# report.plot_suite: Mtok/s against N, a panel per world size and pass
PLOT = {"kind": "lines", "x": "N", "rows": "W", "cols": "pass_"}
CAPPED = "the suite's time cap was reached"


def plan_cases(seq_lens, worlds, n_gpus: int) -> list[tuple[int, int]]:
    """(world size, N) pairs this machine runs, by world size: 1 (the baselines) and each W <= the
    GPUs present, at every N divisible into the 2·W zigzag chunks."""
    return [(w, n) for w in worlds if w <= n_gpus for n in seq_lens if n % (2 * w) == 0]


def providers(world: int) -> tuple[str, ...]:
    return (ONE_GPU, SDPA) if world == 1 else (RING, ALLGATHER, TORCH_CP)


class ContextParallelSuite:
    name = "context_parallel"
    title = "Context parallelism: tokens/s across GPUs (causal, bf16), scaling and torch's CP"
    device = "cuda"

    def __init__(self, seq_lens, quick_seq_lens, worlds=(1, 2, 4, 8), heads: int = 16, head_dim: int = 128,
                 max_n: dict | None = None):
        self.seq_lens, self.quick_seq_lens, self.worlds = tuple(seq_lens), tuple(quick_seq_lens), tuple(worlds)
        self.heads, self.head_dim = heads, head_dim
        # provider -> the longest N it runs at (device time: a 1M-token call on one GPU takes tens of
        # seconds); past it the row is recorded as skipped, with this reason
        self.max_n = dict(max_n or {})

    def describe(self, quick: bool) -> str:
        ns = self.quick_seq_lens if quick else self.seq_lens
        return (f"B=1 H={self.heads} D={self.head_dim} causal bf16, N in {list(ns)}, world sizes "
                f"{list(self.worlds)} (one spawned NCCL group each; needs >= 2 GPUs); providers "
                f"{RING}, {ALLGATHER}, {TORCH_CP}; baselines {ONE_GPU}, {SDPA}; fwd and fwd+bwd")

    def run(self, cfg) -> dict:
        t0 = time.perf_counter()
        n_gpus = torch.cuda.device_count()
        if n_gpus < 2:
            records = [dict(suite=self.name, label="(suite)", provider="(suite)", role="ours", status=h.SKIPPED,
                            error=f"needs >= 2 GPUs for a process group across devices; this machine has "
                                  f"{n_gpus} (NCCL refuses two ranks on one GPU)")]
        else:
            records = self._measure(cfg, n_gpus)
        notes = __doc__.split("\n\n")[2].replace("\n", " ")
        partial = {k: os.environ[k] for k in ("TILED_ATTN_CP_SEQ_LENS", "TILED_ATTN_CP_WORLDS") if os.environ.get(k)}
        if partial:
            notes += " A partial run: " + ", ".join(f"{k}={v}" for k, v in partial.items()) + "."
        return {"name": self.name, "title": self.title, "device": self.device, "unit": "Mtok/s", "ceiling": None,
                "convention": "global tokens per second of the whole group (N / slowest rank's time per call)",
                "notes": notes, "baselines": [TORCH_CP, "1 GPU × W"],
                "plot": PLOT, "elapsed_s": time.perf_counter() - t0,
                "capped": any(r["error"] == CAPPED for r in records), "device_lost": "",
                "records": records, "markdown": _markdown(records)}

    def _measure(self, cfg, n_gpus: int) -> list[dict]:
        import torch.multiprocessing as mp
        ns = self.quick_seq_lens if cfg.quick else self.seq_lens
        worlds = self.worlds
        # A partial run within a device budget: TILED_ATTN_CP_SEQ_LENS / TILED_ATTN_CP_WORLDS (comma
        # lists) replace the declared lengths and world sizes; the results name them.
        if os.environ.get("TILED_ATTN_CP_SEQ_LENS"):
            ns = tuple(int(x) for x in os.environ["TILED_ATTN_CP_SEQ_LENS"].split(","))
        if os.environ.get("TILED_ATTN_CP_WORLDS"):
            worlds = tuple(int(x) for x in os.environ["TILED_ATTN_CP_WORLDS"].split(","))
        deadline = time.time() + (cfg.time_cap_s if cfg.time_cap_s else 1e9)
        rows = []
        # The most GPUs first: a run that reaches its time cap loses one-GPU baselines, not the
        # comparisons of the ring with torch's CP at the machine's size.
        for world in sorted({w for w, _ in plan_cases(ns, worlds, n_gpus)}, reverse=True):
            spec = dict(seq_lens=[n for w, n in plan_cases(ns, worlds, n_gpus) if w == world],
                        heads=self.heads, head_dim=self.head_dim, seed=cfg.seed, deadline=deadline,
                        repeat_s=0.2 if cfg.quick else 0.5, max_n=self.max_n,
                        providers=[p for p in providers(world) if not cfg.provider_filter or cfg.provider_filter(p)])
            with tempfile.TemporaryDirectory() as tmp:
                spec["out"] = os.path.join(tmp, "rows.json")
                try:
                    mp.start_processes(_worker, args=(world, _free_port(), spec), nprocs=world, start_method="spawn")
                    rows += json.load(open(spec["out"]))
                except Exception as err:  # noqa: BLE001 -- one world size failing must not cost the others
                    rows.append(dict(world=world, n=0, provider="(group)", pass_="", status=h.ERROR,
                                     error=f"{type(err).__name__}: {err}"[-400:]))
        return _records(self.name, rows)


# ------------------------------------------------------------------------------------------------
# records and the markdown table
# ------------------------------------------------------------------------------------------------
def _records(suite: str, rows: list[dict]) -> list[dict]:
    ms = {(r["world"], r["n"], r["provider"], r["pass_"]): r.get("ms") for r in rows if r["status"] == h.OK}
    records = []
    for r in rows:
        label = f"N={r['n'] // 1024}k W={r['world']} {r['pass_']}"
        role = "baseline" if r["provider"] in (ONE_GPU, SDPA, TORCH_CP) else "ours"
        rec = dict(suite=suite, label=label, provider=r["provider"], role=role, status=r["status"],
                   error=r.get("error", ""), case=dict(N=r["n"], W=r["world"], pass_=r["pass_"]))
        if r["status"] == h.OK:
            rec.update(ms=r["ms"], value=r["n"] / (r["ms"] / 1e3) / 1e6, pct_ceiling=None, timing="CUDA events")
            one = ms.get((1, r["n"], ONE_GPU, r["pass_"]))
            theirs = ms.get((r["world"], r["n"], TORCH_CP, r["pass_"]))
            rec["ratios"] = {k: v for k, v in (
                ("1 GPU × W", one / (r["world"] * r["ms"]) if one else None),  # scaling efficiency
                (TORCH_CP, theirs / r["ms"] if theirs and role == "ours" else None)) if v is not None}
        records.append(rec)
    return records


def rows_from_log(lines) -> list[dict]:
    """The rows of a run's progress lines (the worker prints one per measured row): what is left of
    a run stopped before its suite wrote its results."""
    import re
    rows = []
    for line in lines:
        m = re.match(r"context_parallel W=(\d+) N=(\d+) (.+) (fwd\+bwd|fwd): (\w+) ?([0-9.]*) ?(.*)$", line.strip())
        if m:
            w, n, prov, pass_, status, ms, err = m.groups()
            row = dict(world=int(w), n=int(n), provider=prov, pass_=pass_, status=status, error=err)
            if ms:
                row["ms"] = float(ms)
            rows.append(row)
    return rows


def _markdown(records) -> list[str]:
    lines = ["| case | provider | Mtok/s | scaling efficiency (vs 1 GPU × W) | speed-up over torch CP |",
             "|---|---|---|---|---|"]
    for r in records:
        if r["status"] != h.OK:
            lines.append(f"| {r['label']} | {r['provider']} | {r['status']}: {r['error'][:80]} | | |")
            continue
        eff, tcp = r["ratios"].get("1 GPU × W"), r["ratios"].get(TORCH_CP)
        lines.append(f"| {r['label']} | {r['provider']} | {r['value']:.2f} | "
                     f"{'' if eff is None else f'{eff:.0%}'} | {'' if tcp is None else f'{tcp:.2f}×'} |")
    return lines


# ------------------------------------------------------------------------------------------------
# one rank
# ------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, spec: dict) -> None:
    import datetime

    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), device_id=torch.device("cuda", rank))
    try:
        rows = []
        for i, n in enumerate(spec["seq_lens"]):
            for prov in spec["providers"]:
                for pass_ in PASSES:
                    row = dict(world=world, n=n, provider=prov, pass_=pass_)
                    late = torch.tensor([float(time.time() > spec["deadline"])], device="cuda")
                    dist.all_reduce(late, op=dist.ReduceOp.MAX)  # every rank skips alike, or none does
                    if late.item():
                        rows.append(dict(row, status=h.SKIPPED, error=CAPPED))
                        continue
                    if n > spec["max_n"].get(prov, n):
                        rows.append(dict(row, status=h.SKIPPED,
                                         error=f"not run past N={spec['max_n'][prov] // 1024}k (the suite's limit)"))
                        continue
                    try:
                        rows.append(dict(row, **_one(prov, pass_, n, world, rank, spec, check=i == 0)))
                    except torch.cuda.OutOfMemoryError as err:
                        rows.append(dict(row, status=h.UNSUPPORTED, error=f"out of memory: {err}"[:300]))
                    torch.cuda.empty_cache()
                    if rank == 0:  # progress in the log: this suite reports only when a world size ends
                        r = rows[-1]
                        print(f"context_parallel W={world} N={n} {prov} {pass_}: {r['status']} "
                              f"{r.get('ms', '')} {r.get('error', '')[:120]}", flush=True)
        if rank == 0:
            with open(spec["out"], "w") as f:
                json.dump(rows, f)
    finally:
        dist.destroy_process_group()


def _inputs(n: int, world: int, rank: int, spec: dict, whole: bool):
    """q, k, v of the whole sequence (the same on every rank: `whole`) or of this rank's zigzag shard."""
    gen = torch.Generator(device="cuda").manual_seed(spec["seed"] + (0 if whole else rank))
    shape = (1, spec["heads"], n if whole else n // world, spec["head_dim"])
    return [torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3)]


def _zigzag(x, world: int, rank: int):
    c = x.shape[2] // (2 * world)
    return torch.cat([x[:, :, rank * c:(rank + 1) * c], x[:, :, (2 * world - 1 - rank) * c:(2 * world - rank) * c]], 2)


def _call(prov: str, world: int):
    """The provider's attention on this rank's tensors (the whole sequence for the one-GPU ones)."""
    import torch.nn.functional as F

    import tiled_attn as ta
    if prov in (RING, ALLGATHER):
        strategy = "ring" if prov == RING else "allgather"
        return lambda q, k, v: ta.distributed.context_parallel_attention(q, k, v, causal=True, strategy=strategy)
    if prov == ONE_GPU:
        return lambda q, k, v: ta.attention(q, k, v, causal=True)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SDPA, torch CP


def _one(prov: str, pass_: str, n: int, world: int, rank: int, spec: dict, check: bool) -> dict:
    import contextlib

    import torch.distributed as dist
    fn = _call(prov, world)
    whole = prov in (ONE_GPU, SDPA, TORCH_CP)
    q, k, v = _inputs(n, world, rank, spec, whole or check)
    if not whole and check:
        q, k, v = (_zigzag(t, world, rank) for t in (q, k, v))
    ctx = contextlib.nullcontext()
    if prov == TORCH_CP:
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import context_parallel
        except ImportError as err:
            return dict(status=h.UNAVAILABLE, error=f"torch's context_parallel: {err}")
        # shards q, k, v in place (its own load-balanced layout) and routes SDPA through its ring
        ctx = context_parallel(init_device_mesh("cuda", (world,)), buffers=[q, k, v], buffer_seq_dims=[2, 2, 2],
                               no_restore_buffers={q, k, v})
    with ctx:
        if check and world > 1 and prov != TORCH_CP:
            bad = _check(fn(q, k, v), n, world, rank, spec)
            if bad:
                return dict(status=h.FAILED, error=bad)
        grad = pass_ == "fwd+bwd"
        for t in (q, k, v):
            t.requires_grad_(grad)
        go = torch.randn_like(q) if grad else None

        def call():
            out = fn(q, k, v)
            if grad:
                q.grad = k.grad = v.grad = None
                out.backward(go)
        return dict(status=h.OK, ms=_time(call, spec["repeat_s"], dist))


def _check(out, n: int, world: int, rank: int, spec: dict) -> str:
    """'' when this shard matches the one-GPU ta.attention of the whole sequence (on rank 0, after a
    gather), else why not; every rank gets the verdict."""
    import torch.distributed as dist

    import tiled_attn as ta
    shards = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(shards, out.contiguous())
    verdict = torch.zeros(1, device="cuda")
    if rank == 0:
        q, k, v = _inputs(n, world, 0, spec, True)
        want = ta.attention(q, k, v, causal=True)
        got = torch.stack([s.float() for s in shards])
        ref = torch.stack([_zigzag(want, world, j).float() for j in range(world)])
        err, tol = (got - ref).abs().max().item(), 4 * 2 ** -8 * ref.abs().max().item()
        verdict.fill_(0.0 if err <= tol else err)
    dist.broadcast(verdict, 0)
    e = verdict.item()
    return "" if e == 0 else f"max |ours − one-GPU ta.attention| = {e:.3g} > 4 bf16 ulps of max |out|"


def _time(call, repeat_s: float, dist) -> float:
    """ms per call: the slowest rank's mean over back-to-back calls, after a warm-up; every rank runs
    the same number of calls (the fewest any rank asked for). A warm-up that alone takes repeat_s
    (compiles included) is the estimate: one timed call follows, without a second untimed one (a
    1M-token call on one GPU takes tens of seconds)."""
    def slowest(seconds: float) -> float:
        # Every decision below is taken on every rank alike, from the slowest rank's time: a rank
        # that skipped the second call while another made it would leave the two in different
        # collectives (seen on 4 H100s: a hang until NCCL's timeout).
        t = torch.tensor([seconds], device="cuda", dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    took = slowest(time.perf_counter() - t0)
    if took < repeat_s:
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        took = slowest(time.perf_counter() - t0)
    reps = torch.tensor([max(1, min(50, int(repeat_s / max(took, 1e-6))))], device="cuda")
    dist.all_reduce(reps, op=dist.ReduceOp.MIN)
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(int(reps.item())):
        call()
    end.record()
    torch.cuda.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / int(reps.item())], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()
