"""Paged against contiguous decode at short caches: kernel time (CUDA-graph replay) per call.

    PYTHONPATH=. python benchmarks/probe_paged_decode.py [--out FILE]

B = 1, GQA 32/8, D = 64 and 128, bf16, Nk from 256 to 32768, pages of 64 and 256 keys through a
shuffled block table; ta.attention_kvcache on both layouts and ta.attention (dense decode) on the
contiguous view. A probe behind the kvcache suite's B = 1 points (issue #15): where paged trails
contiguous, by how much per key length.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402


def _graph_us(fn, reps: int = 200) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps // 20):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 20)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(15)
    rows = []
    for d in (64, 128):
        for nk in (256, 1024, 4096, 32768):
            q = torch.randn(1, 32, 1, d, device=dev, dtype=torch.bfloat16, generator=g)
            kc = torch.randn(1, nk, 8, d, device=dev, dtype=torch.bfloat16, generator=g)
            lens = torch.full((1,), nk, dtype=torch.int32, device=dev)
            row = {"D": d, "Nk": nk,
                   "contiguous": _graph_us(lambda: ta.attention_kvcache(q, kc, kc, lens)),
                   "dense": _graph_us(lambda: ta.attention(q, kc.transpose(1, 2), kc.transpose(1, 2)))}
            ref = ta.attention_kvcache(q, kc, kc, lens).float()
            for page in (64, 256):
                if nk % page:
                    continue
                table = torch.randperm(nk // page, device=dev, generator=g).view(1, -1).to(torch.int32)
                kp = torch.empty(nk // page, page, 8, d, device=dev, dtype=torch.bfloat16)
                kp[table.long()] = kc.view(1, nk // page, page, 8, d)
                out = ta.attention_kvcache(q, kp, kp, lens, block_table=table).float()
                assert torch.equal(out, ref), f"paged-{page} differs from contiguous at D={d} Nk={nk}"
                row[f"paged-{page}"] = _graph_us(lambda: ta.attention_kvcache(q, kp, kp, lens, block_table=table))
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
