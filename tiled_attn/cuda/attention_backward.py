"""The CUDA attention backward: csrc/attention/sm90/flash_bwd_sm90_kernel.cuh (wgmma, sm_90a).

Called by tiled_attn/attention.py (AttentionBackwardPlan) for backend "cuda", which is also backend=None's
backward wherever `selected` says so: `plan_backward` returns the launches for a signature the kernel
covers, or None, and the Triton backward runs instead. Covered:
compute capability 9.0 with the extension's sm90 kernels built, head dims BWD_HEAD_DIMS in fp16/bf16,
Nq and Nk >= 1, no window / softcap / ALiBi / key mask / varlen, deterministic=False (dQ is added
by float32 TMA reduce-adds, atomic at L2, whose order varies between runs), every operand's strides
on TMA's 16-byte rule (a base address off it: that operand is copied for the call), and a
configs.CUDA_ATTENTION_BACKWARD row for the device's arch and the head dim (its "block_m": the
kernel's query rows per step).

One call: delta = rowsum(dO·O) (the Triton delta kernel, which also folds in lse's gradient and zeroes
the float32 (B·Hq, Nq, D) dQ accumulator), the wgmma kernel (dK and dV written, dQ accumulated), then
dq = scale · accumulator (the Triton store kernel of the atomic dQ mode). Extra memory: delta
(B·Hq·Nq floats) and the accumulator (B·Hq·Nq·D floats), as the Triton atomic mode; no N×N tensor.
A small grid with GQA (`schedule`: about one CTA per SM, as a batch-1 training step of a GQA model)
splits each group's query heads among CTAs, and a causal grid of a few waves may run key-tile-major
(the longest walks first); with a split the kernel writes float32 partial dK / dV
(kv_split·B·Hkv·Nk·D floats each, only for grids of at most CUDA_ATTENTION_BACKWARD_SPLIT["max_waves"]
CTAs per SM, so bounded by a constant times the SM count) and the store kernel
(attention_bwd_finish_kernel) sums them in a fixed order.

After a signature's first call the same launches run from C++ (`_WgmmaBackward.register_fast`,
csrc/bindings.cpp attention_bwd_fast: the allocations and three launches in one call, what a
training step's host time was mostly spent on; tiled_attn/attention.py AttentionBackwardPlan).
"""
from __future__ import annotations

import heapq

import torch

from .. import configs
from .._plan import current_stream as _stream
from . import _build
from .attention import reads_in_place

__all__ = ["BWD_HEAD_DIMS", "plan_backward", "covers", "selected", "schedule", "estimate_us"]

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


def _makespan(lengths: list, sms: int) -> float:
    """When the last CTA ends, CTAs of these lengths started in order, each on the first SM to free."""
    free = [0.0] * min(sms, len(lengths))
    heapq.heapify(free)
    end = 0.0
    for t in lengths:
        done = heapq.heappop(free) + t
        end = max(end, done)
        heapq.heappush(free, done)
    return end


def _walks(n_q: int, n_k: int, block_m: int, causal: bool, causal_offset: int) -> list:
    """The query tiles each key tile x (128 keys) walks for one query head: causal, from the tile of
    query 128·x − causal_offset on."""
    m_tiles = -(-n_q // block_m)
    first = [min(max(x * 128 - causal_offset, 0), n_q) if causal else 0 for x in range(-(-n_k // 128))]
    return [m_tiles - f // block_m for f in first]


def estimate_us(batch: int, heads_kv: int, group: int, n_q: int, n_k: int, block_m: int, causal: bool,
                causal_offset: int, sms: int, tile_us: float, elem_bytes: int, head_dim: int, split: int,
                longest_first: bool) -> float:
    """The schedule model's time of the kernel (µs) under one schedule: CTA x of a (batch, virtual
    head) walks its query tiles for group / split heads (+ cta_tiles of set-up), the CTAs start in
    launch order (x fastest, or key-tile-major with `longest_first`) on the first free SM, each tile
    taking tile_us (configs.CUDA_ATTENTION_BACKWARD); a split adds its float32 partials' traffic
    (written, read back, the sums written in the dtype) at reduce_gbps."""
    cfg = configs.CUDA_ATTENTION_BACKWARD_SPLIT
    row = [t * (group // split) + cfg["cta_tiles"] for t in _walks(n_q, n_k, block_m, causal, causal_offset)]
    slots = batch * heads_kv * split
    order = [t for t in row for _ in range(slots)] if longest_first else row * slots
    extra = 0.0
    if split > 1:
        elems = 2 * batch * heads_kv * n_k * head_dim
        extra = elems * (8 * split + elem_bytes) / (cfg["reduce_gbps"] * 1e3)
    return _makespan(order, sms) * tile_us + extra


def schedule(batch: int, heads_kv: int, group: int, n_q: int, n_k: int, block_m: int, causal: bool,
             causal_offset: int, sms: int, tile_us: float, elem_bytes: int, head_dim: int) -> tuple:
    """(kv_split, longest_first) for a call: how many CTAs share each GQA group's query heads (a divisor
    of `group`) and whether the CTAs run key-tile-major, the fastest by `estimate_us` where it gains
    configs.CUDA_ATTENTION_BACKWARD_SPLIT["min_gain"] over the plainer schedule. Only grids of a few
    waves are considered (max_waves for a split, order_waves for the order of a causal grid): beyond
    them the plain launch is kept (larger grids measured 3-10% slower key-tile-major)."""
    cfg = configs.CUDA_ATTENTION_BACKWARD_SPLIT
    ctas = batch * heads_kv * -(-n_k // 128)
    if ctas > cfg["max_waves"] * sms and (not causal or ctas > cfg["order_waves"] * sms):
        return 1, False
    best, best_us = (1, False), None
    splits = [s for s in range(1, group + 1) if group % s == 0] if ctas <= cfg["max_waves"] * sms else [1]
    for split in splits:
        for longest_first in ((False, True) if causal else (False,)):
            us = estimate_us(batch, heads_kv, group, n_q, n_k, block_m, causal, causal_offset, sms, tile_us,
                             elem_bytes, head_dim, split, longest_first)
            if best_us is None or us < best_us * (1 - cfg["min_gain"]):
                best, best_us = (split, longest_first), us
    return best


def plan_backward(q, k, v, out, grad_out, dq, dk, dv, scale: float, causal: bool, causal_offset: int,
                  has_dlse: bool, deterministic: bool = False, mods=None):
    """run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv) for this signature, or None where the
    kernel does not cover it (`covers`)."""
    if not covers(q, k, v, out, grad_out, dq, dk, dv, deterministic, mods):
        return None
    from ..triton.attention import WIDE_STRIDE
    from ..triton.attention_backward import plan_delta, plan_dq_store, plan_finish
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    device = q.device
    wide = max(max(t.stride()) for t in (out, grad_out, dq)) >= WIDE_STRIDE
    delta = plan_delta(out, grad_out, has_dlse, wide, zero_acc=True)
    ext = _build.load(device)
    kernel = ext.attention_bwd_sm90
    row = _row(q)
    block_m = int(row.get("block_m", 64))
    # Beyond the keys every row sees them all (or none): the mask is off, as the forward plans it.
    causal = causal and causal_offset < n_k - 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    split, longest_first = schedule(b, hkv, hq // hkv, n_q, n_k, block_m, causal, causal_offset,
                                    torch.cuda.get_device_properties(index).multi_processor_count,
                                    row.get("tile_us", 3.5), q.element_size(), d)
    if split == 1:
        final = plan_dq_store(dq, scale, wide)
        part_shape = None
    else:
        final = plan_finish(dq, dk, dv, scale, split, wide)
        part_shape = (2, b, hkv * split, n_k, d)
    return _WgmmaBackward(kernel, delta, final, (b, hq, n_q), b * hq * n_q * d, part_shape, scale, causal,
                          causal_offset, block_m, split, longest_first, index)


class _WgmmaBackward:
    """A signature's wgmma backward: `run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv)` launches
    delta (it zeroes the dQ accumulator), the kernel and the dQ store (or, under a split, the finish
    that sums the float32 partials). `register_fast` turns the same launches into one C++ call
    (csrc/bindings.cpp attention_bwd_fast) once the Triton kernels are compiled; AttentionBackwardPlan
    then calls it and keeps this path for what it declines."""

    __slots__ = ("kernel", "delta", "final", "ws_shape", "acc_numel", "part_shape", "args", "index")

    def __init__(self, kernel, delta, final, ws_shape, acc_numel, part_shape, scale, causal, causal_offset, block_m,
                 split, longest_first, index):
        self.kernel, self.delta, self.final, self.index = kernel, delta, final, index
        self.ws_shape, self.acc_numel, self.part_shape = ws_shape, acc_numel, part_shape
        self.args = (scale, causal, causal_offset, block_m, split, longest_first)

    def _workspaces(self, device):
        ws = torch.empty(self.ws_shape, dtype=torch.float32, device=device)  # lse's shape (the binding)
        acc = torch.empty(self.acc_numel, dtype=torch.float32, device=device)
        part = None if self.part_shape is None else torch.empty(self.part_shape, dtype=torch.float32, device=device)
        return ws, acc, part

    def __call__(self, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv):
        ws, acc, part = self._workspaces(q.device)
        self.delta(out, grad_out, lse if grad_lse is None else grad_lse, ws, acc)  # zeroes acc
        # TMA needs 16-byte bases, which a signature does not fix (a view one element in): such an
        # operand goes to the kernel as a copy (dk and dv are the plan's own allocations).
        q, k, v, grad_out = (t if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
                             for t in (q, k, v, grad_out))
        if part is None:
            _build.call(self.kernel, q, k, v, grad_out, lse, ws, acc, dk, dv, *self.args, _stream(self.index))
            self.final(acc, dq)
        else:
            _build.call(self.kernel, q, k, v, grad_out, lse, ws, acc, part[0], part[1], *self.args,
                        _stream(self.index))
            self.final(acc, dq, part, dk, dv)

    def register_fast(self, ext, q, k, v, out, lse, grad_out, dq, dk, dv):
        """After a call without lse's gradient on these (16-byte aligned) tensors: the C++ plan of the
        same launches (`ext`'s attention_bwd_fast_register, a capsule), or None while a Triton
        kernel's aligned build does not exist yet (AttentionBackwardPlan._register_fast tries again)."""
        # The table: q, k, v, out, lse, grad_out (0-5), then what each call allocates: dq, dk, dv,
        # ws, acc (6-10) and the partials (11).
        ws, acc, part = self._workspaces(q.device)
        allocs = [dq, dk, dv, ws, acc] + ([] if part is None else [part])
        kernels = [self.delta.fast_kernel([3, 5, 4, 9, 10]),
                   self.final.fast_kernel([10, 6] if part is None else [10, 6, 11, 7, 8])]
        if None in kernels:
            return None
        if part is None:  # the kernel writes dk and dv, else the two halves of the float32 partials
            kernel_dkv = (7, 8, 0, dk, dv)
        else:
            kernel_dkv = (11, 11, part[1].data_ptr() - part.data_ptr(), part[0], part[1])
        # The wgmma kernel between delta and the store: (place, ws, acc, dk, dv, dv offset, the 4-D
        # views it writes, then its scalars).
        wgmma = (1, 9, 10, *kernel_dkv, *self.args)
        return _build.call(ext.attention_bwd_fast_register, [q, k, v, out, lse, grad_out], allocs, [6, 7, 8],
                           kernels, wgmma)
