"""Time the wgmma attention backward's tiles on this GPU; print rows for configs.CUDA_ATTENTION_BACKWARD.

    PYTHONPATH=. python benchmarks/tune_cuda_attention_backward.py [--out FILE] [--n 1024,4096,16384]

For each head dim the kernel instantiates (csrc/attention/sm90/flash_bwd_sm90_launch.cuh: block_m 64,
and 128 at D = 64), causal on/off, bf16, B·N = 16k tokens, H·D = 2048 (the attention_backward suite's
grid): each candidate row is installed under this GPU's arch and the whole backward of backend "cuda"
(delta, the wgmma kernel, the dQ store: what ships, through AttentionBackwardPlan) is timed, against
the Triton backward's at the same point. A candidate's gradients must first match the Triton
backward's under a loose bound (a few bf16 ulps relative to the largest entry: garbage fails).

Timing: triton.testing.do_bench (its L2 flush between calls), median ms, of torch.autograd.grad over
a forward made once (retain_graph); TFLOP/s counts the backward as 2.5x the forward's 4·B·H·N²·D,
halved when causal.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tiled_attn as ta  # noqa: E402
from tiled_attn import _plan, configs  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
CANDIDATES = {64: (64, 128), 128: (64,)}


def _grads(q, k, v, dout, causal, backend):
    out = ta.attention(q, k, v, causal=causal, backend=backend)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def main() -> int:
    from triton.testing import do_bench
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 16384])
    args = p.parse_args()
    dev = torch.device("cuda")
    arch = configs.arch(dev)
    lines, best = [], {}
    for d, tiles in CANDIDATES.items():
        for causal in (False, True):
            for n in args.n:
                b, h = TOKENS // n, HIDDEN // d
                g = torch.Generator(device=dev).manual_seed(n + d)
                q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
                           for _ in range(3))
                dout = torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g)
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                ref = _grads(q, k, v, dout, causal, "triton")
                want = ref()
                row = [f"D={d:3d} N={n:5d} causal={int(causal)}  triton {flops / do_bench(ref) / 1e9:6.1f}"]
                for bm in tiles:
                    configs.CUDA_ATTENTION_BACKWARD[(arch, d)] = {"kernel": "wgmma", "block_m": bm}
                    _plan.clear_all()  # plans are per signature: the next one reads the new row
                    fn = _grads(q, k, v, dout, causal, "cuda")
                    got = fn()
                    bad = [name for name, x, y in zip("qkv", got, want)
                           if not (x - y).abs().max().item() <= 0.05 * y.abs().max().item() + 1e-3]
                    if bad:
                        row.append(f"bm={bm} WRONG d{','.join(bad)}")
                        continue
                    rate = flops / do_bench(fn) / 1e9
                    row.append(f"bm={bm} {rate:6.1f}")
                    key = (d, causal)
                    best.setdefault(key, {}).setdefault(bm, []).append(rate)
                lines.append("  ".join(row) + "  TFLOP/s")
                print(lines[-1], flush=True)
    lines.append("mean TFLOP/s per tile over N: " + "; ".join(
        f"D={d} causal={int(c)}: " + ", ".join(f"bm={bm} {sum(r) / len(r):.1f}" for bm, r in per.items())
        for (d, c), per in best.items()))
    print(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
