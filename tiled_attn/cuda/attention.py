"""The CUDA attention forward: csrc/attention/ (FlashAttention-2's structure on mma.sync tensor cores).

Called by tiled_attn/attention.py after validation (`_checks.check_attention`), with a preallocated
`out` (B, Hq, Nq, D) laid out (B, Nq, Hq, D) in memory and a contiguous float32 `lse` (B, Hq, Nq).
The kernel reads q, k, v through their (batch, head, seq) strides: a q/k/v split from a packed
(B, N, 3, H, D) projection and transposed is read in place.

Copies: the kernel moves 16-byte chunks, so each of q, k, v must have a contiguous head dim
(stride(-1) == 1), a 16-byte aligned base pointer and batch/head/seq strides that are multiples of
8 elements (dims of size 1 excepted). A tensor that is not is copied with `.contiguous()` first —
the only copy this backend makes of an input (an odd-offset slice or a last-dim-strided view, not the
common layouts). `out` and `lse` from tiled_attn/attention.py always qualify; another `out` or `lse`
gets a temporary that is copied back.

Tile shapes per head dim (and per causal launch where they differ) live in
csrc/attention/flash_fwd.cuh (TileConfig, compile-time: the templates need them) and are mirrored in
configs.CUDA_ATTENTION; `tile_config(d, causal=...)` returns that row.
"""
from __future__ import annotations

import torch

from .. import configs

__all__ = ["HEAD_DIMS", "DTYPES", "require_attention", "attention_forward", "tile_config"]

# What the templates instantiate (csrc/attention/flash_fwd_hdim*.cu); attention_head_dim_supported
# in the extension is the C++ side of the same list.
HEAD_DIMS = (32, 64, 96, 128, 192, 256)
DTYPES = (torch.float16, torch.bfloat16)


def _extension(device: torch.device):
    from ._build import load
    return load(device)


def _call(fn, *args):
    from ._build import call  # every call into the extension goes through it (it raises the errors)
    return call(fn, *args)


def require_attention(q: torch.Tensor) -> None:
    """Raise ValueError unless backend='cuda' runs q's head dim and dtype; then build/load the
    extension (RuntimeError if it cannot be built). Called before any launch."""
    d = q.shape[-1]
    if d not in HEAD_DIMS or q.dtype not in DTYPES:
        got = f"D={d}" if d not in HEAD_DIMS else f"dtype {str(q.dtype).replace('torch.', '')}"
        raise ValueError(f"backend='cuda' supports head dims {HEAD_DIMS} and float16/bfloat16, got {got}; "
                         "use backend='triton'")
    if q.device.type != "cuda":
        raise ValueError(f"backend='cuda' needs CUDA tensors, got q on {q.device}")
    ext = _extension(q.device)
    if not _call(ext.attention_head_dim_supported, d):
        raise RuntimeError(f"the CUDA extension does not instantiate head dim {d} although "
                           f"tiled_attn/cuda/attention.py lists it: rebuild the extension")


def tile_config(d: int, device: torch.device | None = None, causal: bool = False) -> dict:
    """The CUDA_ATTENTION row (tile shape, warps, stages, flags) the kernel uses for head dim d: the
    ("fwd", arch, "*", d, "causal") row for a causal launch where there is one, else the plain row."""
    arch = configs.arch(device) if device is not None else "any"
    if causal:
        try:
            return configs.lookup(configs.CUDA_ATTENTION, ("fwd", arch, "*", d, "causal"), "CUDA attention")
        except KeyError:
            pass
    return configs.lookup(configs.CUDA_ATTENTION, ("fwd", arch, "*", d), "CUDA attention")


def _kernel_ready(t: torch.Tensor, sizes) -> bool:
    """16-byte chunks apply: contiguous last dim, aligned base, strides in multiples of 8 elements
    on every dim that has more than one index."""
    if t.stride(-1) != 1 or t.data_ptr() % 16 != 0:
        return False
    return all(n <= 1 or s % 8 == 0 for s, n in zip(t.stride()[:3], sizes))


def _kernel_input(t: torch.Tensor) -> torch.Tensor:
    return t if _kernel_ready(t, t.shape[:3]) else t.contiguous()


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                      scale: float, causal: bool, causal_offset: int) -> None:
    """Fill `out` (B, Hq, Nq, D) and `lse` (B, Hq, Nq) float32 with attention and its log-sum-exp.

    With `causal`, query i sees key j iff j <= i + causal_offset; a row that sees no key gets output
    0 and lse -inf. Launches on the current stream of q's device.
    """
    require_attention(q)
    b, hq, nq, d = q.shape
    if b * hq * nq == 0:
        return
    if k.shape[2] == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return
    q, k, v = (_kernel_input(t) for t in (q, k, v))
    out_k = out if _kernel_ready(out, out.shape[:3]) else torch.empty(
        b, nq, hq, d, dtype=out.dtype, device=out.device).transpose(1, 2)
    lse_k = lse if lse.is_contiguous() and lse.dtype == torch.float32 else torch.empty(
        b, hq, nq, dtype=torch.float32, device=lse.device)
    ext = _extension(q.device)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _call(ext.attention_fwd, q, k, v, out_k, lse_k, float(scale), bool(causal), int(causal_offset), stream)
    if out_k is not out:
        out.copy_(out_k)
    if lse_k is not lse:
        lse.copy_(lse_k)
