"""The wgmma backward's kernel time under each launch schedule (tiled_attn/cuda/attention_backward.py
`schedule`: the GQA split and the key-tile-major order), forced one at a time, beside the schedule
model's estimate for it (`estimate_us`, what `schedule` compares): whether the model's choice holds
on the GPU, and whether key-tile-major order (longest causal walks first) pays beyond the small
grids it is planned for.

    PYTHONPATH=. python benchmarks/probe_bwd_schedule.py [--out FILE]

Times the backward alone (tiled_attn.attention._backward_impl: delta, the kernel, the dQ store or
finish), CUDA events over back-to-back calls at GPU-bound sizes, median of 5 rounds of >= ~20 ms each.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import tiled_attn as ta  # noqa: F401  (registers the ops)
from tiled_attn import _plan, configs
from tiled_attn.cuda import attention_backward as cb

# (B, Hq, Hkv, N, D): causal, bf16
CASES = [(1, 32, 8, 2048, 64), (1, 32, 8, 4096, 64), (1, 32, 8, 8192, 64), (4, 32, 32, 4096, 64),
         (1, 32, 32, 16384, 64), (4, 16, 16, 4096, 128), (1, 16, 16, 16384, 128), (1, 32, 8, 8192, 128)]


def _model(b, hq, hkv, n, d, split, lf, sms):
    """The schedule model's time (ms) of the causal bf16 case under (split, lf): `schedule`'s own estimate."""
    row = configs.CUDA_ATTENTION_BACKWARD[("sm90", d)]
    return cb.estimate_us(b, hkv, hq // hkv, n, n, row["block_m"], True, 0, sms, row["tile_us"], 2, d, split, lf) / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=None, help="B,Hq,Hkv,N,D;... instead of CASES")
    args = ap.parse_args(argv)
    cases = ([tuple(int(x) for x in c.split(",")) for c in args.cases.split(";")] if args.cases else CASES)
    attn = sys.modules["tiled_attn.attention"]
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    planned = cb.schedule
    lines = [f"{torch.cuda.get_device_name()}: backward alone, ms (median of 5 rounds); model = the schedule "
             f"model's estimate (ms); planned = what `schedule` picks"]
    for b, hq, hkv, n, d in cases:
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn((b, hq, n, d), generator=gen, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn((b, hkv, n, d), generator=gen, device=dev, dtype=torch.bfloat16) for _ in range(2))
        go = torch.randn_like(q)
        out, lse = ta.attention(q, k, v, causal=True, return_lse=True)
        pick = planned(b, hkv, hq // hkv, n, n, configs.CUDA_ATTENTION_BACKWARD[("sm90", d)]["block_m"], True, 0,
                       sms, configs.CUDA_ATTENTION_BACKWARD[("sm90", d)]["tile_us"], 2, d)
        variants = [(1, False), (1, True)] + ([(2, True), (hq // hkv, True)] if hq // hkv > 1 else [])
        for split, lf in dict.fromkeys(variants):
            cb.schedule = lambda *a, s=split, f=lf: (s, f)
            _plan.clear_all()
            call = lambda: attn._backward_impl(go, q, k, v, out, lse, None, d ** -0.5, True, 0, "cuda", False)  # noqa: E731
            for _ in range(3):
                call()
            # Rounds of >= ~20 ms of back-to-back calls, by the model's time of the plain launch.
            reps = max(3, int(20 / max(1e-3, _model(b, hq, hkv, n, d, 1, False, sms))))
            times = []
            for _ in range(5):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(reps):
                    call()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / reps)
            lines.append(f"B={b} H={hq}/{hkv} N={n} D={d} split={split} longest_first={lf!s:5}: "
                         f"{statistics.median(times):7.3f} ms  model {_model(b, hq, hkv, n, d, split, lf, sms):7.3f}"
                         f"{'  <- planned' if (split, lf) == pick else ''}")
            print(lines[-1], flush=True)
        cb.schedule = planned
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
