"""Argument validation shared by every entry point (DESIGN §5).

Everything a kernel could crash on, or silently get wrong, is rejected here in Python, before any
launch, with a ValueError/TypeError that names the argument, what was given and what was expected.
"""
from __future__ import annotations

import os

import torch

BACKENDS = ("triton", "cuda", "torch")
LOW_PRECISION = (torch.float16, torch.bfloat16)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


# Tests set this (tests/conftest.py): every output a backend fills is allocated NaN-filled first, so
# an element a kernel forgets to write fails the numerics check instead of passing as stale memory.
POISON_OUTPUTS = os.environ.get("TILED_ATTN_POISON", "0") == "1"


def new_output(t: torch.Tensor) -> torch.Tensor:
    """Hand a freshly allocated output to a backend (NaN-poisoned under the tests)."""
    if POISON_OUTPUTS:
        t.fill_(float("nan"))
    return t


def triton_interpret() -> bool:
    """True when Triton runs its kernels on the CPU (TRITON_INTERPRET=1): our CI mode."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _names(values) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else _dtype_name(v) for v in values)


def check_tensor(name: str, t, *, ndim: int | None = None, layout_hint: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        hint = f" {layout_hint}" if layout_hint else ""
        raise ValueError(f"{name} must have {ndim} dims{hint}, got shape {tuple(t.shape)}")
    if t.is_complex() or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {_dtype_name(t.dtype)}")


def check_backend(backend, kernel, device: torch.device, dtype: torch.dtype, what: str) -> None:
    """`backend` is None or one of BACKENDS, and can run on `device` in `dtype`."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be None or one of {_names(BACKENDS)}, got {backend!r}")
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be None or a kernel name (str), got {type(kernel).__name__}")
    if kernel is not None and backend is None:
        raise ValueError(f"kernel={kernel!r} needs an explicit backend (one of {_names(BACKENDS)}), "
                         "since kernel names belong to a backend")
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"backend='cuda' needs CUDA tensors, got {what} on {device}")
    if backend == "triton" and device.type != "cuda" and not triton_interpret():
        raise ValueError(f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
                         f"interpreter), got {what} on {device}")
    if backend in ("triton", "cuda") and dtype not in KERNEL_DTYPES:
        raise TypeError(f"backend={backend!r} supports dtypes {_names(KERNEL_DTYPES)}, got "
                        f"{_dtype_name(dtype)} (float64 runs on backend='torch')")


def check_softmax(x, dim, backend, kernel) -> int:
    """Validate ta.softmax's arguments; returns `dim` made non-negative."""
    check_tensor("x", x)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise ValueError(f"dim must be in [{-nd}, {nd - 1}] for x of shape {tuple(x.shape)}, got {dim}")
    if x.dtype not in KERNEL_DTYPES + (torch.float64,):
        raise TypeError(f"x must be float32, float16, bfloat16 or float64, got {_dtype_name(x.dtype)}")
    check_backend(backend, kernel, x.device, x.dtype, "x")
    return dim % nd


def check_attention(q, k, v, scale, backend) -> None:
    """Validate ta.attention's q (B, Hq, Nq, D), k, v (B, Hkv, Nk, D)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4, layout_hint="(B, H, N, D)")
    if q.dtype not in KERNEL_DTYPES + (torch.float64,):
        raise TypeError(f"q must be float16, bfloat16 or float32, got {_dtype_name(q.dtype)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {_dtype_name(q.dtype)}, got {_dtype_name(t.dtype)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    b, hq, _, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, Hkv, Nk, D), got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if k.shape[0] != b:
        raise ValueError(f"k must have q's batch size {b}, got shape {tuple(k.shape)}")
    if k.shape[3] != d:
        raise ValueError(f"k and v must have q's head dim {d}, got shape {tuple(k.shape)}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"q's heads ({hq}) must be a multiple of k/v's heads ({hkv}) for GQA/MQA")
    if d > MAX_HEAD_DIM or d == 0:
        raise ValueError(f"head dim D must be in [1, {MAX_HEAD_DIM}], got {d}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be None or a float, got {type(scale).__name__}")
        if scale != scale or scale in (float("inf"), float("-inf")):
            raise ValueError(f"scale must be finite, got {scale}")
    check_backend(backend, None, q.device, q.dtype, "q")
