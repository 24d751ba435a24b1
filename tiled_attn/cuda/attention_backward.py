"""The CUDA attention backward: csrc/attention/sm90/flash_bwd_sm90_kernel.cuh (wgmma, sm_90a).

Called by tiled_attn/attention.py (AttentionBackwardPlan) for backend "cuda", which is also backend=None's
backward wherever `selected` says so: `plan_backward` returns the launches for a signature the kernel
covers, or None, and the Triton backward runs instead. Covered:
compute capability 9.0 with the extension's sm90 kernels built, head dims BWD_HEAD_DIMS in fp16/bf16,
Nq and Nk >= 1, no window / softcap / ALiBi / key mask / varlen, deterministic=False (dQ is added
with float32 atomics, whose order varies between runs), every operand's strides on TMA's 16-byte
rule (a base address off it: that operand is copied for the call), and a configs.CUDA_ATTENTION_BACKWARD row for the device's arch and the head dim (its
"block_m": the kernel's query rows per step).

One call: delta = rowsum(dO·O) (the Triton delta kernel, which also folds in lse's gradient), a
zeroed float32 (B·Hq, Nq, D) dQ accumulator, the wgmma kernel (dK and dV written, dQ accumulated),
then dq = scale · accumulator (the Triton store kernel of the atomic dQ mode). Extra memory: delta
(B·Hq·Nq floats) and the accumulator (B·Hq·Nq·D floats), as the Triton atomic mode; no N×N tensor.
"""
from __future__ import annotations

import torch

from .. import configs
from .._plan import current_stream as _stream
from . import _build
from .attention import reads_in_place

__all__ = ["BWD_HEAD_DIMS", "plan_backward", "covers", "selected"]

# What csrc/attention/sm90/flash_bwd_sm90_hdim*.cu instantiate (BwdHeadDims in flash_bwd_sm90.cu).
BWD_HEAD_DIMS = (64, 128)


def _row(q: torch.Tensor) -> dict | None:
    """The configs.CUDA_ATTENTION_BACKWARD row of q's device and head dim if it names the wgmma kernel."""
    row = configs.CUDA_ATTENTION_BACKWARD.get((configs.arch(q.device), q.shape[-1]))
    return row if row is not None and row.get("kernel") == "wgmma" else None


def _takes(q) -> bool:
    """q's device, dtype and head dim are the kernel's, with a config row for the device."""
    return (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[-1] in BWD_HEAD_DIMS and _row(q) is not None)


def selected(q) -> bool:
    """Whether backend=None's backward is this one for q's signature (tiled_attn/attention.py
    _with_backward): `_takes` and the extension can be built. No build, no device work; the plan
    still checks the rest (`covers`) and falls back."""
    return _takes(q) and _buildable()


@torch.compiler.assume_constant_result
def _buildable() -> bool:
    """cuda.is_available(), a property of the install: a constant to torch.compile (which would
    otherwise trace its file-system checks) when backend=None's backward is chosen in a traced call."""
    from . import is_available
    return is_available()


def covers(q, k, v, out, grad_out, dq, dk, dv, deterministic: bool, mods) -> bool:
    """Whether the wgmma backward runs this signature (see the module doc). Loads the extension
    (its first load in a process builds it: minutes) to see that its sm90 kernels are in."""
    if deterministic or mods is not None or not _takes(q) or q.shape[2] == 0 or k.shape[2] == 0:
        return False
    # TMA's stride rule is the forward's 16-byte chunks' (the base addresses: per call, in `run`).
    if not all(reads_in_place(t) for t in (q, k, v, grad_out, dk, dv)):
        return False
    ext = _build.load(q.device)
    return bool(getattr(ext, "has_attention_sm90", False)) and hasattr(ext, "attention_bwd_sm90")


def plan_backward(q, k, v, out, grad_out, dq, dk, dv, scale: float, causal: bool, causal_offset: int,
                  has_dlse: bool, deterministic: bool = False, mods=None):
    """run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv) for this signature, or None where the
    kernel does not cover it (`covers`)."""
    if not covers(q, k, v, out, grad_out, dq, dk, dv, deterministic, mods):
        return None
    from ..triton.attention import WIDE_STRIDE
    from ..triton.attention_backward import plan_delta, plan_dq_store
    b, hq, n_q, d = q.shape
    n_k = k.shape[2]
    device = q.device
    wide = max(max(t.stride()) for t in (out, grad_out, dq)) >= WIDE_STRIDE
    delta = plan_delta(out, grad_out, has_dlse, wide)
    store = plan_dq_store(dq, scale, wide)
    ext = _build.load(device)
    kernel = ext.attention_bwd_sm90
    block_m = int(_row(q).get("block_m", 64))
    # Beyond the keys every row sees them all (or none): the mask is off, as the forward plans it.
    causal = causal and causal_offset < n_k - 1
    rows = b * hq * n_q
    index = device.index if device.index is not None else torch.cuda.current_device()

    def run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv):
        ws = torch.empty((b, hq, n_q), dtype=torch.float32, device=device)
        acc = torch.zeros(rows * d, dtype=torch.float32, device=device)
        delta(out, grad_out, lse if grad_lse is None else grad_lse, ws)
        # TMA needs 16-byte bases, which a signature does not fix (a view one element in): such an
        # operand goes to the kernel as a copy (dk and dv are the plan's own allocations).
        q, k, v, grad_out = (t if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
                             for t in (q, k, v, grad_out))
        _build.call(kernel, q, k, v, grad_out, lse, ws, acc, dk, dv, scale, causal, causal_offset, block_m,
                    _stream(index))
        store(acc, dq)
    return run
