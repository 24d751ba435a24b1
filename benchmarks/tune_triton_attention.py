"""Sweep launch configs for the Triton attention kernels on this GPU; print rows for configs.py.

    PYTHONPATH=. python benchmarks/tune_triton_attention.py --out benchmarks/results/tune_triton_attention_h100.py

For every key of configs.TRITON_ATTENTION the benchmark grid touches (bf16; forward: B·N = 32768
tokens, H·D = 2048, D in {64, 128, 256}, N in {512 ("short"), 2048, 8192, 16384 ("long")}, causal
on/off; decode: Nq = 1, Hq = 32, Hkv = 8, D = 128, B in {1, 16}, Nk in {4096, 32768, 131072}), each
candidate row is installed in the table under this GPU's arch and run through the public
ta.attention, so the timing is of the dispatch that ships. A candidate must first match torch SDPA
on the same inputs (|ours − sdpa| <= 2^-6·(1 + |sdpa|): a few bf16 ulps, garbage fails), then is
timed with triton.testing.do_bench (median). The winner per key minimizes the geometric mean time
over the key's shapes. Output: a table with TFLOP/s (forward; causal counts half the FLOPs) or
GB/s of K/V read with % of the measured copy bandwidth (decode), SDPA flash alongside, and a Python
dict to paste into TRITON_ATTENTION.

Runtime (< ~4 min on an H100) is dominated by compiling ~50 kernel variants: --jobs worker
processes compile them in parallel first (each runs every candidate once, filling Triton's disk
cache), so the timing pass only loads binaries.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
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


def _row(bm, bn, w, s):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}


# Candidates per D class: the compile-checked "any" guess first, then neighbours that trade
# registers (BLOCK_M, warps) against latency hiding (BLOCK_N, stages). Shared memory per program
# = (BLOCK_M + 2·stages·BLOCK_N)·BLOCK_D·2 bytes must stay under 227 KB.
FWD_CANDIDATES = {
    "d64": [_row(128, 64, 4, 3), _row(128, 64, 4, 4), _row(128, 128, 4, 3), _row(128, 128, 8, 3),
            _row(64, 64, 4, 4), _row(128, 32, 4, 4), _row(256, 64, 8, 3)],
    "d128": [_row(128, 64, 8, 3), _row(128, 64, 8, 4), _row(128, 128, 8, 2), _row(128, 128, 8, 3),
             _row(128, 64, 4, 3), _row(64, 64, 4, 3), _row(128, 32, 8, 4)],
    "d256": [_row(128, 32, 8, 2), _row(128, 32, 8, 3), _row(128, 64, 8, 2), _row(64, 64, 8, 2),
             _row(64, 32, 4, 3), _row(64, 64, 4, 2)],
}
_HEUR = {"max_rows": 64, "max_q": 8, "waves": 2, "min_split_keys": 256, "merge_rows": 16,
         "merge_warps": 4}
DECODE_CANDIDATES = [
    {**_row(64, 64, 4, 3), **_HEUR},
    {**_row(64, 64, 4, 4), **_HEUR},
    {**_row(64, 128, 4, 3), **_HEUR},
    {**_row(64, 128, 8, 3), **_HEUR},
    {**_row(64, 32, 4, 4), **_HEUR},
    {**_row(64, 64, 4, 3), **_HEUR, "waves": 4},
    {**_row(64, 64, 4, 3), **_HEUR, "waves": 1},
    {**_row(64, 64, 4, 3), **_HEUR, "min_split_keys": 1024},
]


def fwd_keys(arch: str, quick: bool):
    """[(table key, [shape dicts])]: a key per (D class, causal, size class)."""
    ds = (128,) if quick else (64, 128, 256)
    out = []
    for d in ds:
        for causal in (False, True):
            for ns in ((512,), (2048, 8192, 16384)):
                if quick and ns == (512,):
                    continue
                shapes = [dict(B=TOKENS // n, H=HIDDEN // d, N=n, D=d, causal=causal) for n in ns]
                out.append((("fwd", arch, "bf16", d_class(d), causal, size_class(ns[0])), shapes))
    return out


def decode_keys(arch: str, quick: bool):
    bs = (1,) if quick else (1, 16)
    shapes = [dict(B=b, Hq=32, Hkv=8, Nk=nk, D=128) for b in bs for nk in (4096, 32768, 131072)]
    return [(("decode", arch, "bf16", "d128", "*", "*"), shapes)]


def candidates(key):
    return DECODE_CANDIDATES if key[0] == "decode" else FWD_CANDIDATES[key[3]]


def make_inputs(shape, device):
    gen = torch.Generator(device=device).manual_seed(0)
    if "Nk" in shape:
        b, hq, hkv, nk, d = (shape[k] for k in ("B", "Hq", "Hkv", "Nk", "D"))
        q = torch.randn(b, hq, 1, d, device=device, generator=gen, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, nk, d, device=device, generator=gen, dtype=torch.bfloat16)
        v = torch.randn(b, hkv, nk, d, device=device, generator=gen, dtype=torch.bfloat16)
        return q, k, v, False
    b, h, n, d = (shape[k] for k in ("B", "H", "N", "D"))
    q, k, v = (torch.randn(b, h, n, d, device=device, generator=gen, dtype=torch.bfloat16)
               for _ in range(3))
    return q, k, v, shape["causal"]


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


def _precompile(jobs_chunk):
    """Worker: run each (key, candidate, shape) once so Triton compiles it into the disk cache."""
    torch.cuda.init()
    for key, cand, shape in jobs_chunk:
        q, k, v, causal = make_inputs(shape, "cuda")
        install(key, cand)
        try:
            run_once(q, k, v, causal)
            torch.cuda.synchronize()
        except Exception as e:  # reported again (and skipped) by the timing pass
            print(f"  precompile {key} {cand}: {type(e).__name__}: {e}", flush=True)
        del q, k, v
    return len(jobs_chunk)


def precompile(plan, jobs):
    # One shape per kernel variant suffices: the kernels do not specialize on sequence lengths,
    # the grid's strides share their divisibility by 16, and keys that differ only in size class
    # (or decode split heuristics) compile the same kernels.
    todo, seen = [], set()
    for key, shapes in plan:
        for cand in candidates(key):
            variant = (key[:5], tuple(cand[f] for f in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")))
            if variant not in seen:
                seen.add(variant)
                todo.append((key, cand, shapes[0]))
    if jobs <= 1 or not todo:
        return
    ctx = mp.get_context("spawn")
    chunks = [todo[i::jobs] for i in range(jobs)]
    with ctx.Pool(jobs) as pool:
        pool.map(_precompile, chunks)


def copy_bandwidth(device) -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write counted), the decode ceiling."""
    import triton.testing
    x = torch.empty(1 << 29, dtype=torch.float16, device=device)
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=50, return_mode="median")
    return 2 * x.numel() * x.element_size() / ms / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the winning rows (a Python dict) to this file")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                    help="parallel compile workers (0/1: compile in the timing pass)")
    ap.add_argument("--quick", action="store_true", help="D=128 long and B=1 decode only")
    ap.add_argument("--rep", type=int, default=25, help="do_bench rep (ms) per timing")
    args = ap.parse_args()
    import triton.testing

    assert torch.cuda.is_available(), "the sweep needs a CUDA device"
    device = torch.device("cuda")
    arch = configs.arch(device)
    print(f"{torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}", flush=True)
    plan = fwd_keys(arch, args.quick) + decode_keys(arch, args.quick)
    saved = dict(configs.TRITON_ATTENTION)

    t0 = time.time()
    precompile(plan, args.jobs)
    print(f"precompiled in {time.time() - t0:.0f} s", flush=True)
    copy_gbs = copy_bandwidth(device)
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s", flush=True)

    winners, lines = {}, []
    for key, shapes in plan:
        inputs = [make_inputs(s, device) for s in shapes]
        refs = [sdpa_flash(q, k, v, c) for q, k, v, c in inputs]
        base_ms = [triton.testing.do_bench(lambda q=q, k=k, v=v, c=c: sdpa_flash(q, k, v, c),
                                           warmup=5, rep=args.rep, return_mode="median")
                   for q, k, v, c in inputs]
        results = []
        for cand in candidates(key):
            install(key, cand)
            try:
                bad = None
                for (q, k, v, c), ref in zip(inputs, refs):
                    diff = (run_once(q, k, v, c).float() - ref.float()).abs()
                    # NaN-safe: a NaN diff fails the comparison.
                    if not bool((diff <= TOL * (1 + ref.float().abs())).all()):
                        bad = f"max |ours - sdpa| = {diff.max().item():.3g}"
                        break
                if bad:
                    print(f"  {key} {cand}: REJECTED ({bad})", flush=True)
                    continue
                ms = [triton.testing.do_bench(lambda q=q, k=k, v=v, c=c: run_once(q, k, v, c),
                                              warmup=5, rep=args.rep, return_mode="median")
                      for q, k, v, c in inputs]
            except Exception as e:  # e.g. out of shared memory for this tile
                print(f"  {key} {cand}: FAILED ({type(e).__name__}: {str(e)[:120]})", flush=True)
                continue
            geo = math.exp(sum(math.log(t) for t in ms) / len(ms))
            results.append((geo, cand, ms))
        configs.TRITON_ATTENTION.clear()
        configs.TRITON_ATTENTION.update(saved)
        del inputs, refs
        if not results:
            print(f"{key}: no valid candidate", flush=True)
            continue
        results.sort(key=lambda r: r[0])
        geo, best, ms = results[0]
        winners[key] = best
        print(f"{key}: best {best}", flush=True)
        for s, t, tb in zip(shapes, ms, base_ms):
            flops, kv_bytes = work(s)
            if key[0] == "decode":
                gbs, gbs_b = kv_bytes / t / 1e6, kv_bytes / tb / 1e6
                line = (f"    {s}: {t * 1e3:8.1f} us  {gbs:6.0f} GB/s ({100 * gbs / copy_gbs:3.0f}% of copy)"
                        f"  | sdpa {tb * 1e3:8.1f} us {gbs_b:6.0f} GB/s  | x{tb / t:.2f}")
            else:
                line = (f"    {s}: {t:7.3f} ms  {flops / t / 1e9:6.0f} TFLOP/s  | sdpa-flash "
                        f"{flops / tb / 1e9:6.0f} TFLOP/s  | x{tb / t:.2f}")
            print(line, flush=True)
            lines.append(f"# {key[0]} {s}: {line.strip()}")
        for geo_c, cand, ms_c in results[1:]:
            print(f"    also {cand}: x{geo_c / geo:.2f} slower (geomean)", flush=True)

    text = ["# Generated by benchmarks/tune_triton_attention.py on "
            f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}; paste into TRITON_ATTENTION.",
            *lines, "TUNED_TRITON_ATTENTION = {"]
    for key, row in winners.items():
        text.append(f"    {key!r}: {row!r},")
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
