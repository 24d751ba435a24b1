"""The Triton forward at head dims 96 and 192 with the head dim in one padded tile or in two
power-of-two parts (configs TRITON_ATTENTION field TWO_PARTS, attention_fwd_d2_kernel), against
SDPA's cuDNN backend, side by side in one run: the A/B behind the sm90 rows' TWO_PARTS.

    PYTHONPATH=. python benchmarks/probe_two_parts.py [--out FILE.json] [--rounds 3]

Shapes are the attention suite's (B·N = 32768 tokens, H = 2048 // D heads, bf16, N 512-16k, causal
or not), and the other split head dims (48, 80, 160) at N = 4096. Each point times the three providers in turn, `rounds` times (eager per-call events, the
harness's CudaTimer, graph column beside), and prints the medians as TFLOP/s (causal counts half)
and the ratio of two parts to one. Before timing, the two variants' outputs are compared with
cuDNN's (max abs difference printed): a wrong variant is not timed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiled_attn as ta  # noqa: E402
from benchmarks import harness as h  # noqa: E402
from tiled_attn import configs  # noqa: E402

TOKENS, HIDDEN = 32768, 2048


def set_two_parts(on: bool) -> None:
    """TWO_PARTS on every sm90 forward row (the table's change counter rebuilds the plans)."""
    for key, row in list(configs.TRITON_ATTENTION.items()):
        if key[0] == "fwd" and key[1] == "sm90" and row.get("TWO_PARTS", False) != on:
            configs.TRITON_ATTENTION[key] = {**row, "TWO_PARTS": on}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--head-dims", type=int, nargs="*", default=[96, 192])
    ap.add_argument("--seqlens", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--spot-dims", type=int, nargs="*", default=[48, 80, 160],
                    help="the other split head dims, at --spot-n only")
    ap.add_argument("--spot-n", type=int, default=4096)
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer = h.CudaTimer(eager_first=True)
    rows = []
    points = [(d, n) for d in args.head_dims for n in args.seqlens] + [(d, args.spot_n) for d in args.spot_dims]
    for causal in (False, True):
        for d, n in points:
            b, hh = TOKENS // n, HIDDEN // d
            g = torch.Generator(device=dev).manual_seed(n * 1000 + d)
            q, k, v = (torch.randn(b, hh, n, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
            flops = 4.0 * b * hh * n * n * d / (2 if causal else 1)

            def ours(_i):
                return ta.attention(q, k, v, causal=causal, backend="triton")

            def cudnn(_i):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            # name -> (TWO_PARTS set before timing, or None, the call): the table is never
            # touched inside a timed call
            provs = {"one part": (False, ours), "two parts": (True, ours), "sdpa-cudnn": (None, cudnn)}
            try:
                ref = cudnn(0).float()
            except RuntimeError as e:  # a head dim cuDNN lacks: our two against the math backend
                print(f"D={d} N={n}: no cuDNN ({str(e)[:80]})")
                del provs["sdpa-cudnn"]
                ref = F.scaled_dot_product_attention(q[:1].float(), k[:1].float(), v[:1].float(), is_causal=causal)
            err = {}
            for name, (on, fn) in provs.items():
                if on is not None:
                    set_two_parts(on)
                    err[name] = (fn(0)[:ref.shape[0]].float() - ref).abs().max().item()
            eager, graph = {p: [] for p in provs}, {p: [] for p in provs}
            for _ in range(args.rounds):
                for name, (on, fn) in provs.items():
                    if name in err and not err[name] < 0.05:
                        continue
                    if on is not None:
                        set_two_parts(on)
                    t = timer.measure(fn)
                    eager[name].append(t.ms)
                    if t.graph_ms is not None:
                        graph[name].append(t.graph_ms)
            rec = dict(D=d, N=n, B=b, H=hh, causal=causal, err_vs_cudnn=err, eager_rounds_ms=eager,
                       graph_rounds_ms=graph)
            for col, src in (("eager", eager), ("graph", graph)):
                rec[col + "_tflops"] = {p: (flops / statistics.median(src[p]) / 1e9 if src.get(p) else None)
                                        for p in ("one part", "two parts", "sdpa-cudnn")}
            rows.append(rec)
            e, gr = rec["eager_tflops"], rec["graph_tflops"]

            def r(a, c):
                return f"{a / c:.2f}x" if a and c else "n/a"
            print(f"D={d:3d} N={n:5d} causal={causal!s:5}  eager TFLOP/s one {e['one part'] or 0:6.0f} "
                  f"two {e['two parts'] or 0:6.0f} cudnn {e['sdpa-cudnn'] or 0:6.0f}  two/one "
                  f"{r(e['two parts'], e['one part'])} two/cudnn {r(e['two parts'], e['sdpa-cudnn'])}  "
                  f"| graph two/one {r(gr['two parts'], gr['one part'])} two/cudnn "
                  f"{r(gr['two parts'], gr['sdpa-cudnn'])}  err {err}", flush=True)
            del q, k, v
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
