"""Sweep launch configs for the Triton attention kernels on this GPU; print rows for configs.py.

    PYTHONPATH=. python benchmarks/tune_triton_attention.py --out tuned_attention.py [--quick] [--flex]

For every key of configs.TRITON_ATTENTION the benchmark grid touches (bf16; forward: B·N = 32768
tokens, H·D = 2048, D in {64, 128, 256}, N in {512 ("short"), 2048, 8192, 16384 ("long")}, causal
on/off; decode: Nq = 1, Hq = 32, Hkv = 8, D = 128, B in {1, 16}, Nk in {4096, 32768, 131072}), each
candidate row is installed in the table under this GPU's arch and run through the public
ta.attention, so the timing is of the dispatch that ships. A candidate must first match torch SDPA
on the same inputs (|ours − sdpa| <= 2^-6·(1 + |sdpa|): a few bf16 ulps, garbage fails).

Candidates: tiles (BLOCK_M × BLOCK_N, warps, stages) crossed with the kernel-structure switches of
attention_fwd.py (FMA: exp2 argument as one FMA on raw scores; LATE_L: row sum after the P·V
product; ADDR: "ptr" carried pointer tensors, "offs" pointers rebuilt per tile, "tma" Hopper tensor
descriptors); decode adds the split heuristics (waves = programs per SM, min_split_keys) and the
merge kernel's warps. Every candidate compiles for sm_90a without register spills
(tests/test_attention.py::test_triton_attention_compiles_for_sm90a).

Timing is kernel time, as the benchmark harness measures it: CUDA-graph replays of the call, input
sets rotating through >= 2x L2 (a decode step at B = 1, Nk = 4096 reads 17 MB: without rotation it
would be timed from L2). Decode also reports eager time per call (launch + Python overhead
included, what a user without CUDA graphs pays; SDPA's alongside). The winner per key minimizes
the geometric-mean kernel time over the key's shapes. Output: per shape TFLOP/s (forward; causal
counts half the FLOPs) or GB/s of K/V read and % of the measured copy bandwidth (decode), SDPA
flash alongside, the FlexAttention figures of the last benchmark run as targets (--flex measures
them instead: a torch.compile per shape, ~1 min more), and a dict to paste into configs._SM90_ROWS.

Runtime on an H100: ~150 s, dominated by compiling ~150 kernel variants; --jobs worker processes
compile them in parallel first (each runs every candidate once, filling Triton's disk cache), so
the timing pass only loads binaries.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tiled_attn as ta  # noqa: E402
from tiled_attn import configs  # noqa: E402
from tiled_attn.triton.attention import d_class, size_class  # noqa: E402

TOKENS, HIDDEN = 32768, 2048
TOL = 2.0 ** -6
L2_BYTES = 50 * 2 ** 20

# FlexAttention (torch.compile, torch 2.11, default kernel options) on the H100, TFLOP/s, from
# /work/notes/gpu/call4/results/2026-11-22-nvidia-h100-80gb-hbm3-attention.md: the bar is >= 1.0x
# these at every point. Keys: (D, N, causal).
FLEX_TARGETS = {
    (64, 512, False): 335, (64, 2048, False): 406, (64, 8192, False): 432, (64, 16384, False): 429,
    (128, 512, False): 338, (128, 2048, False): 472, (128, 8192, False): 507, (128, 16384, False): 509,
    (256, 512, False): 282, (256, 2048, False): 357, (256, 8192, False): 374, (256, 16384, False): 377,
    (64, 512, True): 184, (64, 2048, True): 324, (64, 8192, True): 387, (64, 16384, True): 395,
    (128, 512, True): 198, (128, 2048, True): 340, (128, 8192, True): 410, (128, 16384, True): 429,
    (256, 512, True): 170, (256, 2048, True): 263, (256, 8192, True): 306, (256, 16384, True): 316,
}


def _row(bm, bn, w, s, **switches):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, **switches}


# Tiles per D class: the measured winners of the first sweep, FlexAttention's H100 defaults
# (torch/_inductor/kernel/flex: D = 64: 128x128 at 4 warps, D = 128: 128x64 at 8, 3 stages) and
# neighbours that trade registers against latency hiding. Shared memory per program =
# (BLOCK_M + 2·stages·BLOCK_N)·BLOCK_D·2 bytes must stay under 227 KB.
FWD_TILES = {
    "d64": [_row(128, 64, 4, 3), _row(128, 128, 4, 3), _row(64, 64, 4, 4), _row(128, 128, 8, 3)],
    "d128": [_row(128, 128, 8, 3), _row(128, 64, 8, 3), _row(64, 64, 4, 3)],
    "d256": [_row(128, 64, 8, 2), _row(128, 32, 8, 3)],
}
# Kernel-structure switches crossed with every tile (attention_fwd.py).
SWITCHES = [
    {},
    {"FMA": True},
    {"ADDR": "offs"},
    {"ADDR": "tma"},
    {"FMA": True, "ADDR": "offs"},
    {"FMA": True, "ADDR": "tma"},
    {"FMA": True, "LATE_L": True, "ADDR": "offs"},
    {"FMA": True, "LATE_L": True, "ADDR": "tma"},
]
# (D class, tile, switches) that spill registers for sm_90a (ptxas -v, Triton 3.6, 2026-11; the
# FMA form keeps one more value per row live): left out.
SPILLS = [
    ("d64", _row(128, 128, 4, 3), {}),
    ("d64", _row(128, 128, 4, 3), {"FMA": True}),
    ("d64", _row(128, 128, 4, 3), {"ADDR": "offs"}),
    ("d64", _row(128, 128, 4, 3), {"FMA": True, "ADDR": "offs"}),
    ("d64", _row(128, 128, 4, 3), {"FMA": True, "LATE_L": True, "ADDR": "offs"}),
    ("d128", _row(128, 128, 8, 3), {"FMA": True}),
    ("d128", _row(128, 128, 8, 3), {"FMA": True, "ADDR": "offs"}),
    ("d256", _row(128, 64, 8, 2), {"FMA": True}),
    ("d256", _row(128, 64, 8, 2), {"FMA": True, "ADDR": "offs"}),
    ("d256", _row(128, 64, 8, 2), {"FMA": True, "LATE_L": True, "ADDR": "offs"}),
]

_DECODE_BASE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "max_rows": 64,
                "max_q": 8, "waves": 2, "min_split_keys": 1024, "merge_warps": 4}
# Decode: overrides of the base row (the first sweep's winner). waves = programs per SM: 3 fit at
# 3 stages of 64x128 K and V tiles (70 KB of shared memory, 128-168 registers at the 16-row tile);
# fewer stages fit more.
DECODE_CANDIDATES = [
    {},
    {"waves": 1},
    {"waves": 3},
    {"num_stages": 2, "waves": 3},
    {"num_stages": 2, "waves": 4},
    {"num_stages": 4},
    {"BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
    {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "waves": 3},
    {"BLOCK_N": 32, "num_stages": 4, "waves": 4},
    {"min_split_keys": 512},
    {"min_split_keys": 256, "waves": 4, "num_stages": 2},
    {"ADDR": "offs"},
    {"FMA": True, "ADDR": "offs"},
    {"FMA": True, "LATE_L": True, "ADDR": "offs"},
    {"merge_warps": 8},
    # K/V through tensor descriptors (TMA): one copy instruction per tile instead of a
    # [BLOCK_N, D] pointer tensor (session 4, not yet timed: the decode loop ran at ~88% of copy in
    # steady state where cuDNN reads at 100-106%).
    {"ADDR": "tma"},
    {"ADDR": "tma", "FMA": True},
    {"ADDR": "tma", "num_stages": 4},
    {"ADDR": "tma", "BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
]


def fwd_candidates(dcls: str) -> list[dict]:
    out = []
    for tile in FWD_TILES[dcls]:
        for sw in SWITCHES:
            if any(dcls == c and tile == t and sw == s for c, t, s in SPILLS):
                continue
            out.append({**tile, **sw})
    return out


def candidates(key) -> list[dict]:
    """Every candidate row for a TRITON_ATTENTION key (also read by the sm_90a compile test)."""
    if key[0] == "decode":
        return [{**_DECODE_BASE, **c} for c in DECODE_CANDIDATES]
    return fwd_candidates(key[3])


def fwd_keys(arch: str, quick: bool, head_dims=None):
    """[(table key, [shape dicts])]: a key per (D class, causal, size class)."""
    ds = head_dims or ((64, 128) if quick else (64, 128, 256))
    out = []
    for d in ds:
        for causal in (False, True):
            for ns in ((512,), (2048, 8192, 16384)):
                if quick and ns == (512,):
                    continue
                if quick:
                    ns = (8192,)
                shapes = [dict(B=TOKENS // n, H=HIDDEN // d, N=n, D=d, causal=causal) for n in ns]
                out.append((("fwd", arch, "bf16", d_class(d), causal, size_class(ns[0])), shapes))
    return out


def decode_keys(arch: str, quick: bool):
    bs = (1,) if quick else (1, 16)
    shapes = [dict(B=b, Hq=32, Hkv=8, Nk=nk, D=128) for b in bs for nk in (4096, 32768, 131072)]
    return [(("decode", arch, "bf16", "d128", "*", "*"), shapes)]


def _shape_bytes(shape) -> int:
    if "Nk" in shape:
        return 2 * shape["B"] * shape["Hkv"] * shape["Nk"] * shape["D"] * 2
    return 3 * shape["B"] * shape["H"] * shape["N"] * shape["D"] * 2


def make_inputs(shape, device, n_sets: int = 1):
    """n_sets independent (q, k, v, causal) input sets of the shape."""
    gen = torch.Generator(device=device).manual_seed(0)
    sets = []
    for _ in range(n_sets):
        if "Nk" in shape:
            b, hq, hkv, nk, d = (shape[k] for k in ("B", "Hq", "Hkv", "Nk", "D"))
            q = torch.randn(b, hq, 1, d, device=device, generator=gen, dtype=torch.bfloat16)
            k = torch.randn(b, hkv, nk, d, device=device, generator=gen, dtype=torch.bfloat16)
            v = torch.randn(b, hkv, nk, d, device=device, generator=gen, dtype=torch.bfloat16)
            sets.append((q, k, v, False))
        else:
            b, h, n, d = (shape[k] for k in ("B", "H", "N", "D"))
            q, k, v = (torch.randn(b, h, n, d, device=device, generator=gen, dtype=torch.bfloat16)
                       for _ in range(3))
            sets.append((q, k, v, shape["causal"]))
    return sets


def rotation(shape) -> int:
    """Input sets to cycle so that consecutive calls miss L2 (>= 2x L2 in all)."""
    return max(1, math.ceil(2 * L2_BYTES / _shape_bytes(shape)))


def sdpa_flash(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    gqa = q.shape[1] != k.shape[1]
    backends = [SDPBackend.FLASH_ATTENTION] if not gqa else [SDPBackend.FLASH_ATTENTION,
                                                             SDPBackend.EFFICIENT_ATTENTION,
                                                             SDPBackend.MATH]
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def work(shape):
    """(FLOPs, K/V bytes) of one call."""
    if "Nk" in shape:
        return 4 * shape["B"] * shape["Hq"] * shape["Nk"] * shape["D"], \
            2 * shape["B"] * shape["Hkv"] * shape["Nk"] * shape["D"] * 2
    flops = 4 * shape["B"] * shape["H"] * shape["N"] ** 2 * shape["D"]
    return (flops / 2 if shape["causal"] else flops), 0


def install(key, cand):
    configs.TRITON_ATTENTION[key] = dict(cand)


def run_once(q, k, v, causal):
    return ta.attention(q, k, v, causal=causal, backend="triton")


def graph_ms(fn, sets, target_ms: float = 2.0, reps: int = 7) -> float:
    """Median kernel time per call (ms) from CUDA-graph replays of calls cycling through `sets`."""
    for s in sets:  # warm-up: compile, allocate
        fn(*s)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for s in sets:
        fn(*s)
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / len(sets), 1e-3)
    calls = len(sets) * max(1, math.ceil(target_ms / (est * len(sets))))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s in sets:  # allocations on the capture stream happen before capture
            fn(*s)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


def eager_ms(fn, sets, budget_ms: float = 30.0) -> float:
    """Time per call (ms) of back-to-back eager calls: kernel time, or the host's launch rate where
    that is slower (a B = 1 decode step). As many calls as fit in ~budget_ms, 20 to 400."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    start.record()
    for i in range(2 * len(sets)):
        fn(*sets[i % len(sets)])
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / (2 * len(sets)), 1e-3)
    calls = int(min(400, max(20, budget_ms / est)))
    start.record()
    for i in range(calls):
        fn(*sets[i % len(sets)])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def _precompile(jobs_chunk):
    """Worker: run each (key, candidate, shape) once so Triton compiles it into the disk cache."""
    torch.cuda.init()
    for key, cand, shape in jobs_chunk:
        (q, k, v, causal), = make_inputs(shape, "cuda")
        install(key, cand)
        try:
            run_once(q, k, v, causal)
            torch.cuda.synchronize()
        except Exception as e:  # reported again (and skipped) by the timing pass
            print(f"  precompile {key} {cand}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del q, k, v
    return len(jobs_chunk)


def precompile(plan, jobs):
    # One shape per kernel variant suffices: the kernels do not specialize on sequence lengths,
    # the grid's strides share their divisibility by 16, and keys that differ only in size class
    # (or decode split heuristics) compile the same kernels. The smallest shape of a key: the
    # workers' inputs are allocated together on one GPU.
    fields = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "FMA", "LATE_L", "ADDR", "merge_warps")
    todo, seen = [], set()
    for key, shapes in plan:
        small = min(shapes, key=_shape_bytes)
        for cand in candidates(key):
            variant = (key[:5], tuple(cand.get(f) for f in fields))
            if variant not in seen:
                seen.add(variant)
                todo.append((key, cand, small))
    if jobs <= 1 or not todo:
        return len(todo)
    ctx = mp.get_context("spawn")
    chunks = [todo[i::jobs] for i in range(jobs)]
    with ctx.Pool(jobs) as pool:
        pool.map(_precompile, chunks)
    return len(todo)


def copy_bandwidth(device) -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write counted), the decode ceiling."""
    import triton.testing
    x = torch.empty(1 << 29, dtype=torch.float16, device=device)
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=50, return_mode="median")
    return 2 * x.numel() * x.element_size() / ms / 1e6


def flex_tflops(shape) -> float:
    """FlexAttention's TFLOP/s on the shape (torch.compile per shape: slow, --flex only)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 64
    sets = make_inputs(shape, "cuda")
    f = torch.compile(flex_attention, dynamic=False)
    mask = (create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, shape["N"], shape["N"], device="cuda")
            if shape["causal"] else None)
    ms = graph_ms(lambda q, k, v, c: f(q, k, v, block_mask=mask), sets)
    return work(shape)[0] / ms / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the winning rows (a Python dict) to this file")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="parallel compile workers (0/1: compile in the timing pass)")
    ap.add_argument("--quick", action="store_true", help="D=64/128 at N=8192 and B=1 decode only")
    ap.add_argument("--only", choices=("fwd", "decode"), help="sweep one kernel only")
    ap.add_argument("--flex", action="store_true", help="measure FlexAttention on each forward shape")
    ap.add_argument("--head-dims", type=int, nargs="*", choices=(64, 128, 256),
                    help="forward: sweep these head dims only (a run cut short resumes where it stopped)")
    args = ap.parse_args()

    assert torch.cuda.is_available(), "the sweep needs a CUDA device"
    device = torch.device("cuda")
    arch = configs.arch(device)
    print(f"{torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}", flush=True)
    plan = []
    if args.only in (None, "fwd"):
        plan += fwd_keys(arch, args.quick, args.head_dims)
    if args.only in (None, "decode"):
        plan += decode_keys(arch, args.quick)
    saved = dict(configs.TRITON_ATTENTION)

    t0 = time.time()
    n = precompile(plan, args.jobs)
    print(f"precompiled {n} variants in {time.time() - t0:.0f} s", flush=True)
    copy_gbs = copy_bandwidth(device)
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s", flush=True)

    winners, lines = {}, []
    for key, shapes in plan:
        inputs = [make_inputs(s, device, rotation(s)) for s in shapes]
        refs = [sdpa_flash(*sets[0]) for sets in inputs]
        base_ms = [graph_ms(sdpa_flash, sets) for sets in inputs]
        base_eager = [eager_ms(sdpa_flash, sets) for sets in inputs] if key[0] == "decode" else None
        results = []
        for cand in candidates(key):
            install(key, cand)
            try:
                bad = None
                for sets, ref in zip(inputs, refs):
                    diff = (run_once(*sets[0]).float() - ref.float()).abs()
                    # NaN-safe: a NaN diff fails the comparison.
                    if not bool((diff <= TOL * (1 + ref.float().abs())).all()):
                        bad = f"max |ours - sdpa| = {diff.max().item():.3g}"
                        break
                if bad:
                    print(f"  {cand}: REJECTED ({bad})", flush=True)
                    continue
                ms = [graph_ms(run_once, sets) for sets in inputs]
                eager = [eager_ms(run_once, sets) for sets in inputs] if key[0] == "decode" else None
            except Exception as e:  # e.g. out of shared memory for this tile
                print(f"  {cand}: FAILED ({type(e).__name__}: {str(e)[:160]})", flush=True)
                continue
            geo = math.exp(sum(math.log(t) for t in ms) / len(ms))
            results.append((geo, cand, ms, eager))
        configs.TRITON_ATTENTION.clear()
        configs.TRITON_ATTENTION.update(saved)
        if not results:
            print(f"{key}: no valid candidate", flush=True)
            continue
        results.sort(key=lambda r: r[0])
        geo, best, ms, eager = results[0]
        winners[key] = best
        print(f"{key}: best {best}", flush=True)
        for j, (s, t, tb) in enumerate(zip(shapes, ms, base_ms)):
            flops, kv_bytes = work(s)
            if key[0] == "decode":
                gbs, gbs_b = kv_bytes / t / 1e6, kv_bytes / tb / 1e6
                line = (f"    {s}: {t * 1e3:7.1f} us {gbs:5.0f} GB/s ({100 * gbs / copy_gbs:3.0f}% of copy)"
                        f" | sdpa {tb * 1e3:7.1f} us {gbs_b:5.0f} GB/s | x{tb / t:.2f}"
                        f" | eager {eager[j] * 1e3:6.1f} us vs sdpa {base_eager[j] * 1e3:6.1f} us"
                        f" x{base_eager[j] / eager[j]:.2f}")
            else:
                ours = flops / t / 1e9
                flex = flex_tflops(s) if args.flex else FLEX_TARGETS.get((s["D"], s["N"], s["causal"]))
                line = (f"    {s}: {t:7.3f} ms {ours:5.0f} TFLOP/s | sdpa-flash {flops / tb / 1e9:5.0f}"
                        f" x{tb / t:.2f} | flex {flex or float('nan'):5.0f} x{ours / flex if flex else float('nan'):.2f}")
            print(line, flush=True)
            lines.append(f"# {key[0]} {line.strip()}")
        for geo_c, cand, ms_c, _ in results[1:]:
            print(f"    also {cand}: x{geo_c / geo:.3f} slower (geomean)", flush=True)
        del inputs, refs
        torch.cuda.empty_cache()

    text = ["# Generated by benchmarks/tune_triton_attention.py on "
            f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}; paste into configs._SM90_ROWS "
            "(keyed without arch and dtype: fp16 takes the bf16 winners).", *lines, "TUNED_SM90_ROWS = {"]
    for key, row in winners.items():
        text.append(f"    {(key[0],) + key[3:]!r}: {row!r},")
    text.append("}")
    print("\n".join(text))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(text) + "\n")
        print(f"wrote {args.out}")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
