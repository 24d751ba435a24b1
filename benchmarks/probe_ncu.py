"""Targets for Nsight Compute: the kernels behind the two open gaps of 2026-11-26 (H200), each run a
few times so `ncu --launch-skip` can take a warm launch.

    ncu --clock-control none --target-processes all --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
        --section LaunchStats --section WarpStateStats -o OUT/NAME \
        python benchmarks/probe_ncu.py NAME

Targets:
  softmax-fp32-triton / softmax-fp32-cuda / softmax-fp32-torch: 65536x128 fp32, the ladder shape
      where every kernel of ours trails torch.softmax in kernel time (79-81% of copy against 89%).
  decode-contiguous / decode-paged64: ta.attention_kvcache at B=1, GQA 32/8, D=128, bf16, 4096
      keys, contiguous and 64-key pages through a shuffled block table (paged 0.88x contiguous in
      kernel time).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402


def _targets(dev: torch.device) -> dict:
    g = torch.Generator(device=dev).manual_seed(12)
    x = torch.randn(65536, 128, device=dev, generator=g)
    q = torch.randn(1, 32, 1, 128, device=dev, dtype=torch.bfloat16, generator=g)
    kc = torch.randn(1, 4096, 8, 128, device=dev, dtype=torch.bfloat16, generator=g)
    lens = torch.full((1,), 4096, dtype=torch.int32, device=dev)
    table = torch.randperm(64, device=dev, generator=g).view(1, 64).to(torch.int32)
    pool = torch.empty(64, 64, 8, 128, device=dev, dtype=torch.bfloat16)
    pool[table[0].long()] = kc.view(64, 64, 8, 128)
    return {
        "softmax-fp32-triton": lambda: ta.softmax(x, backend="triton"),
        "softmax-fp32-cuda": lambda: ta.softmax(x, backend="cuda"),
        "softmax-fp32-torch": lambda: torch.softmax(x, -1),
        "decode-contiguous": lambda: ta.attention_kvcache(q, kc, kc, lens),
        "decode-paged64": lambda: ta.attention_kvcache(q, pool, pool, lens, block_table=table),
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dev = torch.device("cuda")
    targets = _targets(dev)
    if len(argv) != 1 or argv[0] not in targets:
        print(f"usage: probe_ncu.py NAME, NAME one of {', '.join(targets)}")
        return 2
    fn = targets[argv[0]]
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
