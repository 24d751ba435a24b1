"""The CUDA backend: the csrc/ kernels (the softmax ladder, its fused backward, the attention
forward), compiled into one extension on first use and cached (tiled_attn/cuda/_build.py).

Importing this package needs no compiler and no GPU. `is_available()` is cheap: a visible CUDA device,
a CUDA toolkit (nvcc), ninja and the csrc/ sources. `require()` raises a RuntimeError that says what
is missing and how to fix it.
"""
from __future__ import annotations

import functools

from . import _build
from .softmax import SOFTMAX_KERNELS, softmax_backward, softmax_forward

__all__ = ["SOFTMAX_KERNELS", "is_available", "require", "softmax_forward", "softmax_backward",
           "attention_forward", "require_attention", "load"]

load = _build.load


@functools.lru_cache(maxsize=None)
def is_available() -> bool:
    """True when the extension can be built and run here (cached: the answer is a property of the
    install). Does not build anything."""
    return not _build.missing()


def require() -> None:
    """Raise RuntimeError naming what the CUDA backend lacks here (nothing when it can run)."""
    if is_available():
        return
    problems = _build.missing()
    if problems:
        raise RuntimeError("backend='cuda' is not available: " + "; ".join(problems)
                           + ". backend='triton' or backend='torch' need no CUDA toolkit.")


def _attention_module():
    try:
        from . import attention
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.attention":
            raise
        raise RuntimeError("the CUDA attention wrapper (tiled_attn/cuda/attention.py) is not part of "
                           "this install: use backend='triton' or backend='torch'") from e
    return attention


def attention_forward(q, k, v, out, lse, scale, causal, causal_offset):
    """Fill out (B, Hq, Nq, D) and lse (B, Hq, Nq) with the fused attention forward (csrc/attention)."""
    return _attention_module().attention_forward(q, k, v, out, lse, scale, causal, causal_offset)


def require_attention(q) -> None:
    """Raise if the CUDA attention kernel cannot take q (dtype, head dim) on this install."""
    return _attention_module().require_attention(q)
