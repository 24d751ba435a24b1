"""The numerics rule of DESIGN §4, stated once, and the input makers every test uses.

Rule: with e_ours = max|ours − ref| and e_torch = max|torch's own op in the input dtype − ref|, where
ref is the same op in float64 on the same (already rounded) inputs, a result passes iff
    e_ours ≤ 2·e_torch + eps(dtype).
NaN must appear exactly where the reference has NaN; ±inf exactly where it has ±inf; anywhere else
a non-finite value fails. Every failure message carries the seed and both errors.
"""
from __future__ import annotations

import os

import torch

from tiled_attn import _checks

HAS_CUDA = torch.cuda.is_available()
INTERPRET = _checks.triton_interpret()
LOW = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def fresh_seed() -> int:
    """A new seed every run (fresh inputs), printed by every failure that uses it."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def device_for(backend: str) -> str:
    """Where a backend's tensors live in this run: CUDA when present, else the CPU (the Triton
    interpreter runs CPU tensors)."""
    return "cuda" if HAS_CUDA else "cpu"


def backend_available(backend: str) -> bool:
    if backend == "torch":
        return True
    if backend == "triton":
        return HAS_CUDA or INTERPRET
    if backend == "cuda":
        if not HAS_CUDA:
            return False
        from tiled_attn import cuda
        return cuda.is_available()
    raise ValueError(backend)


def skip_reason(backend: str) -> str:
    if backend == "triton":
        return "Triton backend needs a CUDA device or TRITON_INTERPRET=1"
    return f"{backend} backend needs a CUDA device with a CUDA toolchain"


def randn(shape, dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Normal draws made on the CPU from `gen` (reproducible from the seed), then moved."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)


def max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x − ref| over the entries where ref is finite; non-finite x there counts as inf."""
    x, ref = x.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    d = (x[finite] - ref[finite]).abs()
    d = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
    return d.max().item()


def assert_rule(ours: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, *, dtype: torch.dtype,
                seed: int, what: str = "") -> None:
    """Assert DESIGN §4: `ours` against the float64 `ref`, allowed 2× torch's own error + eps."""
    ours_c, ref_c = ours.detach().double().cpu(), ref.detach().double().cpu()
    tag = f"[{what} seed={seed}]"
    assert ours_c.shape == ref_c.shape, f"{tag} shape {tuple(ours_c.shape)} != reference {tuple(ref_c.shape)}"
    nan_ref, nan_ours = torch.isnan(ref_c), torch.isnan(ours_c)
    assert torch.equal(nan_ours, nan_ref), (
        f"{tag} NaN pattern differs from the reference: {int(nan_ours.sum())} NaN in ours, "
        f"{int(nan_ref.sum())} in the reference, {int((nan_ours & ~nan_ref).sum())} unexpected")
    inf_ref = torch.isinf(ref_c)
    assert torch.equal(ours_c[inf_ref], ref_c[inf_ref]), f"{tag} ±inf entries differ from the reference"
    e_ours = max_err(ours_c, ref_c)
    e_torch = max_err(torch_out, ref_c)
    tol = 2 * e_torch + torch.finfo(dtype).eps
    assert e_ours <= tol, (f"{tag} error {e_ours:.3e} exceeds 2×torch's {e_torch:.3e} + eps "
                           f"({tol:.3e}) for {dtype}")
