"""Sweep the split-KV decode's split heuristics (waves, min_split_keys) on this GPU, on every
layout a decode step reads: the KV-cache API on a contiguous and a paged cache, and ta.attention.

    PYTHONPATH=. python benchmarks/tune_decode_splits.py [--out FILE.json] [--quick]

Why (issue #15; ncu on the H200, benchmarks/results/ncu/): under the rule before
attention.decode_splits, B = 1 with Nk = 4096 ran 8 splits per kv head (min_split_keys 512), 64
programs on 132 SMs: the SMs were busy 38% of the kernel, each program walking 8 key tiles one
after another. More, shorter splits fill the SMs, at the price of a larger partial workspace and
merge; at large batch, too many splits make a grid of a wave and a bit. The sweep of 2026-11-26
(results/sweeps/2026-11-26-h200-decode-splits-grid) is what decode_splits was written from.

Candidates: the table's decode row with (min_split_keys, waves) replaced (the rule that reads
them: tiled_attn/triton/attention.py:decode_splits), for each of MIN_SPLIT_KEYS x WAVES, or the
--candidates given. Shapes: the kvcache suite's (B 1/8/32, Nq 1/4, Nk 4096/32768) and the
decode suite's (B 1/16, Nq 1, Nk 4096..131072); GQA 32/8, D = 128, bf16. Providers: "contiguous"
(ta.attention_kvcache, (B, Nk, Hkv, D) cache), "paged-64" / "paged-256" (the same keys through a
shuffled block table), "dense" (ta.attention on the cache's (B, Hkv, Nk, D) view). Kernel time from
CUDA-graph replays with input sets rotating through >= 2x L2 (tune_triton_attention.graph_ms).
Every output is checked against an fp32 SDPA reference (|ours - ref| <= 2^-6 (1 + |ref|)).

Prints, per candidate, the geometric mean of time over the shapes per provider relative to the
table's row, and the smallest paged / contiguous ratio (the #15 bar: >= 0.95 at pages >= 64);
the full table goes to --out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402
from tiled_attn import configs  # noqa: E402
from tiled_attn.triton.attention import config  # noqa: E402
from benchmarks.harness import rotation_sets  # noqa: E402
from benchmarks.tune_triton_attention import copy_bandwidth, graph_ms  # noqa: E402

MIN_SPLIT_KEYS = (64, 128, 256, 512)
WAVES = (1, 2, 3, 4)
PAGES = (64, 256)
HQ, HKV, D = 32, 8, 128


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(B, Nq, Nk)."""
    if quick:
        return [(1, 1, 4096), (32, 1, 4096), (1, 1, 32768)]
    kv = [(b, nq, nk) for nq in (1, 4) for b in (1, 8, 32) for nk in (4096, 32768)]
    dec = [(1, 1, 131072), (16, 1, 4096), (16, 1, 32768), (16, 1, 131072), (1, 1, 1024), (1, 1, 16384)]
    return kv + dec


def make_sets(b, nq, nk, dev, gen):
    """Rotating input sets: q, the contiguous caches, seqlens, and per page size (pool_k, pool_v, table)."""
    one = 2 * b * nk * HKV * D * 2
    sets = []
    for _ in range(rotation_sets(one, dev)):
        q = torch.randn(b, HQ, nq, D, device=dev, dtype=torch.bfloat16, generator=gen)
        kc = torch.randn(b, nk, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
        vc = torch.randn(b, nk, HKV, D, device=dev, dtype=torch.bfloat16, generator=gen)
        lens = torch.full((b,), nk, dtype=torch.int32, device=dev)
        pages = {}
        for p in PAGES:
            n = b * nk // p
            table = torch.randperm(n, device=dev, generator=gen).view(b, nk // p).to(torch.int32)
            kp = torch.empty(n, p, HKV, D, device=dev, dtype=torch.bfloat16)
            vp = torch.empty_like(kp)
            kp[table.long()] = kc.view(b, nk // p, p, HKV, D)
            vp[table.long()] = vc.view(b, nk // p, p, HKV, D)
            pages[p] = (kp, vp, table)
        sets.append((q, kc, vc, lens, pages))
    return sets


def providers():
    def contiguous(q, kc, vc, lens, pages):
        return ta.attention_kvcache(q, kc, vc, lens, causal=True)

    def paged(p):
        def fn(q, kc, vc, lens, pages):
            kp, vp, table = pages[p]
            return ta.attention_kvcache(q, kp, vp, lens, block_table=table, causal=True)
        return fn

    def dense(q, kc, vc, lens, pages):
        return ta.attention(q, kc.transpose(1, 2), vc.transpose(1, 2), causal=True)

    return {"contiguous": contiguous, **{f"paged-{p}": paged(p) for p in PAGES}, "dense": dense}


def reference(q, kc, vc):
    """fp32 SDPA, bottom-right causal (the Nq queries are the last positions). The GQA group is
    folded into the query rows (row g·Nq + i of kv head j is query i of head j·G + g), so K/V are
    never repeated in memory."""
    b, nq, nk, g = q.shape[0], q.shape[2], kc.shape[1], HQ // HKV
    mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq).repeat(g, 1)
    out = F.scaled_dot_product_attention(q.float().reshape(b, HKV, g * nq, D), kc.transpose(1, 2).float(),
                                         vc.transpose(1, 2).float(), attn_mask=mask)
    return out.reshape(b, HQ, nq, D)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="3 shapes")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    ap.add_argument("--candidates", nargs="*", default=None, metavar="MSK,WAVES",
                    help="only these (min_split_keys, waves), e.g. 512,2 256,2 (default: the grid)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    gen = torch.Generator(device=dev).manual_seed(15)
    copy = copy_bandwidth(dev)
    base_row = config("decode", dev, torch.bfloat16, D, False, 4096)
    keys = [k for k in configs.TRITON_ATTENTION if k[0] == "decode" and k[1] == configs.arch(dev)]
    saved = {k: configs.TRITON_ATTENTION[k] for k in keys}
    cands = ([tuple(int(x) for x in c.split(",")) for c in args.candidates] if args.candidates
             else [(msk, w) for msk in MIN_SPLIT_KEYS for w in WAVES])
    base = (base_row["min_split_keys"], base_row["waves"])
    if base not in cands:
        cands.insert(0, base)
    print(f"# {name}: copy {copy:.0f} GB/s; table row {base}; keys {keys}", flush=True)
    fns = providers()
    results = []  # {B, Nq, Nk, provider, min_split_keys, waves, us, gbps}
    try:
        for b, nq, nk in shapes(args.quick):
            sets = make_sets(b, nq, nk, dev, gen)
            ref = reference(*sets[0][:3])
            nbytes = 2 * b * nk * HKV * D * 2 + 2 * b * HQ * nq * D * 2
            for msk, w in cands:
                for k in keys:
                    configs.TRITON_ATTENTION[k] = dict(saved[k], min_split_keys=msk, waves=w)
                for name, fn in fns.items():
                    out = fn(*sets[0]).float()
                    err = (out - ref).abs().max().item()
                    tol = 2 ** -6 * (1 + ref.abs().max().item())
                    if not err <= tol:
                        print(f"FAILED B={b} Nq={nq} Nk={nk} {name} ({msk},{w}): err {err:.3g} > {tol:.3g}",
                              flush=True)
                        continue
                    ms = graph_ms(fn, sets)
                    results.append(dict(B=b, Nq=nq, Nk=nk, provider=name, min_split_keys=msk, waves=w,
                                        us=ms * 1e3, gbps=nbytes / ms / 1e6))
                row = [r for r in results if (r["B"], r["Nq"], r["Nk"], r["min_split_keys"], r["waves"])
                       == (b, nq, nk, msk, w)]
                print(f"B={b:2d} Nq={nq} Nk={nk:6d} ({msk:3d},{w}) " +
                      " ".join(f"{r['provider']}={r['us']:.1f}us({100 * r['gbps'] / copy:.0f}%)" for r in row),
                      flush=True)
            del sets
            torch.cuda.empty_cache()
    finally:
        for k in keys:
            configs.TRITON_ATTENTION[k] = saved[k]

    # Summary: per candidate, geometric-mean time relative to the table's row, per provider; the
    # worst paged / contiguous ratio (contiguous time / paged time) at pages >= 64.
    def t(r_b, prov, cand):
        for r in results:
            if (r["B"], r["Nq"], r["Nk"], r["provider"], r["min_split_keys"], r["waves"]) == r_b + (prov,) + cand:
                return r["us"]
        return None

    pts = sorted({(r["B"], r["Nq"], r["Nk"]) for r in results})
    print("\n# candidate (min_split_keys, waves): geomean time / table row's, per provider; worst paged/contig")
    summary = []
    for cand in cands:
        line = {"min_split_keys": cand[0], "waves": cand[1]}
        for prov in fns:
            ratios = [t(p, prov, cand) / t(p, prov, base) for p in pts
                      if t(p, prov, cand) and t(p, prov, base)]
            line[prov] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        worst = [t(p, "contiguous", cand) / t(p, f"paged-{pg}", cand) for p in pts for pg in PAGES
                 if t(p, "contiguous", cand) and t(p, f"paged-{pg}", cand)]
        line["worst_paged_ratio"] = min(worst) if worst else None
        summary.append(line)
        print(f"({cand[0]:3d},{cand[1]}) " + " ".join(
            f"{k}={v:.3f}" for k, v in line.items() if k not in ("min_split_keys", "waves") and v is not None),
            flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": name, "copy_gbps": copy,
                                        "table_row": base, "results": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
