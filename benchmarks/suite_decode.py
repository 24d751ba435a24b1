"""Decode (issue 6): one query token against a long GQA K/V cache (Hq=32, Hkv=8, D=128, bf16);
memory-bound, so GB/s of K/V read against SDPA with enable_gqa=True."""
from . import harness as h

# Issue 14's grid: B 1-64, Nk 2k-128k (B=64 at Nk=128k reads 34 GB of K/V).
SHAPES = [dict(B=b, Hq=32, Hkv=8, Nk=nk, D=128) for b in (1, 4, 16, 64) for nk in (2048, 8192, 32768, 131072)]
QUICK = [dict(B=1, Hq=32, Hkv=8, Nk=32768, D=128), dict(B=16, Hq=32, Hkv=8, Nk=131072, D=128)]

SUITE = h.Suite(
    name="decode", title="Decode (Nq=1, GQA 32/8) vs SDPA", op=h.DECODE, device="cuda",
    shapes=SHAPES, quick_shapes=QUICK, dtypes=("bf16",),
    providers=[h.default_attention(), h.ours_attention("triton"), h.ours_attention("cuda"), h.sdpa(), h.sdpa("flash"),
               h.sdpa("cudnn"), h.sdpa("efficient")],
    baselines=("sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"),
    plot=h.Plot("bars"),
)
