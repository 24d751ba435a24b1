"""What a call adds to plain (causal) attention: a window, softcap, ALiBi, a key mask, packed
sequences, a KV cache — validated once and summed up in `Mods`, the part of a plan's signature the
Triton planner (tiled_attn/triton/attention.py, plan_forward_ext) and the backward read.

The score model is DESIGN §3's (tiled_attn/triton/masks.py writes it for the kernels,
tiled_attn/reference.py for the torch backend). A call with none of these has `mods = None` and
takes the dense path, unchanged.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import _checks


class Mods(NamedTuple):
    left: int = -1                 # window's left edge (keys before i + offset − left hidden); -1 none
    right: int = -1                # right edge as given (causal folds in as 0 at planning); -1 none
    softcap: float = 0.0           # c > 0: s = c·tanh(s / c); 0 off
    alibi_stride: int = -1         # slopes' batch stride (0: (Hq,) slopes); -1 off
    key_mask: int = 0              # 0 off, 1 bool (B, Nk), 2 float (B, Nk) additive
    mask_strides: tuple = (0, 0)   # the key mask's (batch, key) strides
    varlen: tuple | None = None    # (sequences, max_seqlen_q, max_seqlen_k)
    seq_k: bool = False            # per-row key lengths (a KV cache's)
    # (page_size, pages in the cache, block_table's row stride, block_table's width): a row holds
    # at most page_size · width keys.
    paged: tuple | None = None

    @property
    def plain(self) -> bool:
        return self == _PLAIN


_PLAIN = Mods()


def window_pair(window, what: str = "window") -> tuple[int, int]:
    """(left, right) from None or a pair of ints >= -1 (-1: unbounded)."""
    if window is None:
        return -1, -1
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) for w in window)):
        raise TypeError(f"{what} must be None or a pair of ints (left, right), -1 for unbounded, got {window!r}")
    left, right = window
    if left < -1 or right < -1:
        raise ValueError(f"{what} entries must be >= -1 (-1: unbounded), got {tuple(window)}")
    return int(left), int(right)


def softcap_value(softcap) -> float:
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be None or a positive float, got {type(softcap).__name__}")
    if not (softcap > 0 and math.isfinite(softcap)):
        raise ValueError(f"softcap must be a positive finite float, got {softcap}")
    return float(softcap)


def alibi_stride(alibi_slopes, q: torch.Tensor, batch: int) -> int:
    """The batch stride the kernels read ALiBi slopes with: 0 for (Hq,), the tensor's own for
    (B, Hq); -1 without slopes."""
    if alibi_slopes is None:
        return -1
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be None or a float32 tensor, got {type(alibi_slopes).__name__}")
    hq = q.shape[1]
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {_checks._dtype_name(alibi_slopes.dtype)}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes must be on q's device {q.device}, got {alibi_slopes.device}")
    shape = tuple(alibi_slopes.shape)
    if shape == (hq,):
        if alibi_slopes.stride(0) != 1:
            raise ValueError("alibi_slopes of shape (Hq,) must be contiguous")
        return 0
    if shape == (batch, hq):
        if alibi_slopes.stride(1) != 1:
            raise ValueError("alibi_slopes of shape (B, Hq) must have unit stride along heads")
        return alibi_slopes.stride(0)
    raise ValueError(f"alibi_slopes must have shape (Hq,) = ({hq},) or (B, Hq) = ({batch}, {hq}), got {shape}")


def make(window=None, softcap=None, alibi_slopes=None, q=None, batch: int = 0, **extra) -> Mods:
    left, right = window_pair(window)
    return Mods(left=left, right=right, softcap=softcap_value(softcap),
                alibi_stride=alibi_stride(alibi_slopes, q, batch), **extra)


def reference_kwargs(mods: Mods, slopes, key_mask) -> dict:
    """The same modifications as tiled_attn.reference's keyword arguments (the torch backend)."""
    kw = {}
    if mods.left >= 0 or mods.right >= 0:
        kw["window"] = (mods.left, mods.right)
    if mods.softcap > 0:
        kw["softcap"] = mods.softcap
    if slopes is not None:
        kw["alibi_slopes"] = slopes
    if key_mask is not None:
        kw["key_mask"] = key_mask
    return kw
