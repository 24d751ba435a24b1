"""Paged against contiguous decode at short caches: kernel time of builds of the paged kernel.

    PYTHONPATH=. python benchmarks/probe_paged_decode.py [--out FILE.json]

Issue #15: after the split rule of 2026-11-26 (attention.decode_splits) paged decode was within
1-3% of contiguous everywhere but at B = 1 and short caches, where a paged program cost ~0.9 µs more
(H200, GQA 32/8, D = 128: 12.2 vs 11.3 µs at 4096 keys, 8.9 vs 7.8 at 1024, one to four key tiles
a program); ncu put that time in the wait for the first tile's block-table entry. Timed here per
build of the paged kernel: PAGED_EXTRA_STAGES (pipeline stages added where a tile's address waits
on a table read) and PAGED_VEC_MAX (0: a table read per tile; > 0: a split's entries in one vector
read beside SeqK's), on tune_decode_splits.py's providers (contiguous, paged-64, paged-256;
CUDA-graph replays, input sets rotating through >= 2x L2), each output checked against fp32 SDPA.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiled_attn import _plan  # noqa: E402
from tiled_attn.triton import attention as ta_triton  # noqa: E402
from benchmarks.tune_decode_splits import make_sets, providers, reference  # noqa: E402
from benchmarks.tune_triton_attention import graph_ms  # noqa: E402

SHAPES = [(1, 1, 1024), (1, 1, 4096), (1, 4, 4096), (1, 1, 32768), (32, 1, 4096)]
BUILDS = [(2, 0), (2, 64), (0, 64)]  # (PAGED_EXTRA_STAGES, PAGED_VEC_MAX)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(15)
    fns = {k: v for k, v in providers().items() if k != "dense"}
    saved = ta_triton.PAGED_EXTRA_STAGES, ta_triton.PAGED_VEC_MAX
    rows = []
    try:
        for b, nq, nk in SHAPES:
            sets = make_sets(b, nq, nk, dev, gen)
            ref = reference(*sets[0][:3])
            for extra, vec_max in BUILDS:
                ta_triton.PAGED_EXTRA_STAGES, ta_triton.PAGED_VEC_MAX = extra, vec_max
                _plan.clear_all()
                row = {"B": b, "Nq": nq, "Nk": nk, "extra_stages": extra, "vec_max": vec_max}
                for name, fn in fns.items():
                    err = (fn(*sets[0]).float() - ref).abs().max().item()
                    assert err <= 2 ** -6 * (1 + ref.abs().max().item()), f"{name} {row}: err {err}"
                    row[name] = graph_ms(fn, sets) * 1e3
                rows.append(row)
                print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
            del sets
            torch.cuda.empty_cache()
    finally:
        ta_triton.PAGED_EXTRA_STAGES, ta_triton.PAGED_VEC_MAX = saved
        _plan.clear_all()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
