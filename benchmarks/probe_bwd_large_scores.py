"""Why the Triton attention backward missed the rule at |scores| ~ 1e4 (fp16, issue #13): the named
case of tests/test_attention_backward.py (test_large_scores_named_seeds) with the backward kernels
fed different lse and out, each dq/dk/dv error printed against the float64 reference and torch's.

    PYTHONPATH=. python benchmarks/probe_bwd_large_scores.py

Variants: the forward's own (out, lse); lse from the float64 reference rounded to float32 once;
out from the reference rounded to the input dtype once; both. If the exact lse brings dk within
the rule, the forward's lse rounding (attention_fwd's finalize, online.lse) is the cause.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import tiled_attn as ta  # noqa: E402
from tiled_attn import reference  # noqa: E402
from tiled_attn.triton.attention_backward import attention_backward  # noqa: E402
import test_attention_backward as t  # noqa: E402
from helpers import max_err, randn  # noqa: E402


def main() -> int:
    seed, dtype, causal, d = 552450262, torch.float16, False, 32
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: under TRITON_INTERPRET=1
    gen = torch.Generator().manual_seed(seed)
    q, k, v = t._qkv(2, 6, 2, 33, 40, d, dtype, dev, gen, 2500.0)
    go = randn(q.shape, dtype, dev, gen)
    scale = 1.0 / math.sqrt(d)
    offset = k.shape[2] - q.shape[2]
    ref = t._reference(q, k, v, go, None, causal, scale, offset)
    tg = t._torch_grads(q, k, v, go, None, causal, scale, offset, ref)
    out, lse = ta.attention(q, k, v, scale=scale, return_lse=True, backend="triton")
    q64, k64, v64 = (x.double() for x in (q, k, v))
    out64, lse64 = reference.attention(q64, k64, v64, causal, scale, True, offset)
    print(f"torch's errors: " + ", ".join(f"{n} {max_err(a, r):.3e}" for n, a, r in zip("qkv", tg, ref)))
    print(f"forward: out err {max_err(out, out64):.3e}, lse err {max_err(lse, lse64):.3e} "
          f"(|lse| max {lse64.abs().max().item():.1f}, float32 ulp there {torch.finfo(torch.float32).eps * lse64.abs().max().item():.2e})")
    for name, o, l in (("ours", out, lse), ("exact lse", out, lse64.float()),
                       ("exact out", out64.to(dtype), lse), ("exact both", out64.to(dtype), lse64.float())):
        grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
        attention_backward(q, k, v, o, l.contiguous(), go, *grads, scale, causal, offset)
        errs = [max_err(g, r) for g, r in zip(grads, ref)]
        bound = [2 * max_err(x, r) + torch.finfo(dtype).eps for x, r in zip(tg, ref)]
        print(f"{name:>10}: " + ", ".join(f"d{n} {e:.3e} (bound {b:.3e}){' FAIL' if e > b else ''}"
                                          for n, e, b in zip("qkv", errs, bound)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
