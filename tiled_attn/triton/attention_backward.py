"""The Triton attention backward: plan the three launches of attention_bwd.py (delta, dK/dV, dQ).

Called by tiled_attn/attention.py (AttentionBackwardPlan) for backend "triton", and for backend
"cuda" where its wgmma backward (tiled_attn/cuda/attention_backward.py) does not cover the call
(other GPUs and head dims, deterministic=True, float32): the forwards save the same lse.
`plan_backward` does what depends only on the signature (the config rows of
configs.TRITON_ATTENTION_BACKWARD, the dQ mode, constexprs, grids) and returns the launches
(`_TritonBackward`); a call then costs its workspaces (delta; the float32 dQ accumulator in the
atomic mode) and three launches through their compiled kernels (launch.py), or, after the
signature's first call, one C++ call that allocates and launches the same (`register_fast`,
csrc/bindings.cpp attention_bwd_fast).
"""
from __future__ import annotations

import itertools

import torch

from .. import configs
from . import online
from .attention import MIN_DOT, WIDE_STRIDE, _cdiv, _effective_causal, _pow2, _window_flags, d_class
from .attention_bwd import (attention_bwd_delta_kernel, attention_bwd_dkdv_kernel, attention_bwd_dq_kernel,
                            attention_bwd_dq_store_kernel, attention_bwd_finish_kernel)
from .attention_bwd_ext import attention_bwd_dkdv_ext_kernel, attention_bwd_dq_ext_kernel
from .launch import Launch, interpreted

__all__ = ["plan_backward", "attention_backward", "config"]


def config(kernel: str, device: torch.device, dtype: torch.dtype, d: int, arch: str | None = None) -> dict:
    """The TRITON_ATTENTION_BACKWARD row of `kernel` ("dkdv" or "dq") for this call: an exact dtype
    before "*" (float32's own rows win over an arch's 16-bit ones), then the device's arch before
    "any"; completed with TRITON_ATTENTION_BACKWARD_DEFAULTS. `arch` overrides the device's
    (offline compiles)."""
    arch = arch or configs.arch(device)
    for dt, a in itertools.product((configs.dtype_key(dtype), "*"), (arch, "any")):
        for dc in (d_class(d), "*"):  # the "cpu" rows hold for every head dim
            row = configs.TRITON_ATTENTION_BACKWARD.get((kernel, a, dt, dc))
            if row is not None:
                return {**configs.TRITON_ATTENTION_BACKWARD_DEFAULTS, **row}
    raise KeyError(f"no TRITON_ATTENTION_BACKWARD config for {(kernel, arch, configs.dtype_key(dtype), d_class(d))}:"
                   " add a row to tiled_attn/configs.py")


def dq_mode(q: torch.Tensor, deterministic: bool, arch: str | None = None) -> str:
    """How dQ is computed: "pass" (its own kernel, bitwise-repeatable) or "atomic" (float32 atomic
    adds from the dK/dV kernel), by the dkdv row's "dq" field; deterministic=True forces "pass"."""
    return "pass" if deterministic else config("dkdv", q.device, q.dtype, q.shape[-1], arch)["dq"]


def launch_constants(q: torch.Tensor, kernel: str, interpret: bool, causal: bool,
                     arch: str | None = None, atomic_dq: bool = False) -> dict:
    """The constexprs and launch options of `kernel` for q's dtype and head dim."""
    d = q.shape[-1]
    row = config(kernel, q.device, q.dtype, d, arch)
    fp32 = q.dtype == torch.float32
    upcast = q.dtype == torch.bfloat16 and interpret  # attention_fwd.kv_loop: the interpreter's bf16
    block_d = max(MIN_DOT, _pow2(d))
    const = dict(CAUSAL=causal, BLOCK_M=row["BLOCK_M"], BLOCK_N=row["BLOCK_N"], HEAD_DIM=d,
                 BLOCK_D=block_d, EVEN_D=block_d == d,
                 # float32: a true fp32 product (TF32 breaks the numerics rule, as in the forward).
                 PRECISION="ieee" if fp32 or upcast else "tf32", UPCAST=upcast,
                 num_warps=row["num_warps"], num_stages=row["num_stages"])
    if kernel == "dkdv":
        const["ATOMIC_DQ"] = atomic_dq
        const["BAND"] = row["band"]
    return const


def plan_backward(q, k, v, out, grad_out, dq, dk, dv, scale: float, causal: bool, causal_offset: int,
                  has_dlse: bool, deterministic: bool = False, mods=None):
    """run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv): the launches that fill dq, dk, dv for
    tensors with these shapes, strides, dtype and device. grad_lse is None unless has_dlse; lse
    is the forward's contiguous (B, Hq, Nq) float32. deterministic: dQ by its own pass (dq_mode).
    With `mods` (a window, softcap, ALiBi, key mask, varlen): plan_backward_ext's launches, whose
    run also takes the forward's extra tensors (slopes, key_mask, cu_q, cu_k)."""
    if mods is not None:
        return plan_backward_ext(q, k, v, out, grad_out, dq, dk, dv, scale, causal, causal_offset, has_dlse,
                                 mods)
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    device = q.device
    interpret = device.type != "cuda" or interpreted(attention_bwd_dq_kernel)
    causal, offset = _effective_causal(causal, causal_offset, n_q, n_k)
    strides = [t.stride() for t in (q, k, v, out, grad_out, dq, dk, dv)]
    wide = max(max(s) for s in strides) >= WIDE_STRIDE
    sq, sk, sv, so, sdo, sdq, sdk, sdv = strides
    qk_scale = scale * online.LOG2E

    atomic = dq_mode(q, deterministic) == "atomic"
    dkdv = launch_constants(q, "dkdv", interpret, causal, atomic_dq=atomic)
    dqc = launch_constants(q, "dq", interpret, causal)
    n_tiles = _cdiv(n_k, dkdv["BLOCK_N"])
    m_tiles = _cdiv(n_q, dqc["BLOCK_M"])
    delta = plan_delta(out, grad_out, has_dlse, wide, zero_acc=atomic)
    dkdv_launch = Launch(attention_bwd_dkdv_kernel, (b * hkv * n_tiles,), dict(dkdv, WIDE=wide),
                         device).bind(*sq, *sk, *sv, *sdo, *sdk, *sdv, hkv, hq // hkv, n_q, n_k, offset,
                                      qk_scale, scale, n_tiles)
    delta_size = b * hq * n_q
    if atomic:
        return _TritonBackward(delta, dkdv_launch, plan_dq_store(dq, scale, wide, dkdv["UPCAST"]), delta_size,
                               delta_size * d)
    dq_launch = Launch(attention_bwd_dq_kernel, (b * hq * m_tiles,), dict(dqc, WIDE=wide),
                       device).bind(*sq, *sk, *sv, *sdo, *sdq, hq, hq // hkv, n_q, n_k, offset,
                                    qk_scale, scale, m_tiles)
    return _TritonBackward(delta, dkdv_launch, dq_launch, delta_size, 0)


class _TritonBackward:
    """A signature's Triton backward: `run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv)` launches
    delta, the dK/dV kernel and the dQ pass, or with a dQ accumulator (atomic mode, acc_numel > 0:
    delta zeroes it, the dK/dV kernel adds dQ to it) the dQ store. `register_fast` turns the same
    launches into one C++ call (csrc/bindings.cpp attention_bwd_fast) once they are compiled;
    tiled_attn/attention.py AttentionBackwardPlan then calls it and keeps this path for what it
    declines."""

    __slots__ = ("delta", "dkdv", "last", "ws_numel", "acc_numel")

    def __init__(self, delta, dkdv, last, ws_numel: int, acc_numel: int):
        self.delta, self.dkdv, self.last = delta, dkdv, last
        self.ws_numel, self.acc_numel = ws_numel, acc_numel

    def _workspaces(self, device):
        ws = torch.empty(self.ws_numel, dtype=torch.float32, device=device)
        acc = torch.empty(self.acc_numel, dtype=torch.float32, device=device) if self.acc_numel else None
        return ws, acc

    def __call__(self, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv):
        ws, acc = self._workspaces(q.device)
        if acc is not None:
            self.delta(out, grad_out, lse if grad_lse is None else grad_lse, ws, acc)  # zeroes acc
            self.dkdv(q, k, v, grad_out, lse, ws, dk, dv, acc)
            self.last(acc, dq)
        else:
            self.delta(out, grad_out, lse if grad_lse is None else grad_lse, ws, ws)
            self.dkdv(q, k, v, grad_out, lse, ws, dk, dv, ws)  # no accumulator: ATOMIC_DQ is off
            self.last(q, k, v, grad_out, lse, ws, dq)

    def register_fast(self, ext, q, k, v, out, lse, grad_out, dq, dk, dv):
        """As the wgmma backward's (tiled_attn/cuda/attention_backward.py): the C++ plan of the same
        launches (a capsule), or None while one's aligned build does not exist yet."""
        # The table: q, k, v, out, lse, grad_out (0-5), then dq, dk, dv, ws (6-9) and the accumulator (10).
        ws, acc = self._workspaces(q.device)
        a = 9 if acc is None else 10  # delta's and dK/dV's last tensor: the accumulator, or ws again
        kernels = [self.delta.fast_kernel([3, 5, 4, 9, a]), self.dkdv.fast_kernel([0, 1, 2, 5, 4, 9, 7, 8, a]),
                   self.last.fast_kernel([0, 1, 2, 5, 4, 9, 6] if acc is None else [10, 6])]
        if None in kernels:
            return None
        from ..cuda import _build
        allocs = [dq, dk, dv, ws] + ([] if acc is None else [acc])
        return _build.call(ext.attention_bwd_fast_register, [q, k, v, out, lse, grad_out], allocs, [6, 7, 8],
                           kernels, None)


def plan_delta(out, grad_out, has_dlse: bool, wide: bool, zero_acc: bool = False) -> Launch:
    """delta = rowsum(dO·O) (minus lse's gradient with has_dlse) into a float32 (B, Hq, Nq) buffer:
    the launch, called as (out, grad_out, lse or grad_lse, delta, acc). zero_acc: it also zeroes acc,
    the float32 (B·Hq, Nq, D) dQ accumulator of the atomic adds (else acc is not touched: pass any
    tensor). Also the CUDA backward's first step (tiled_attn/cuda/attention_backward.py)."""
    b, hq, n_q, d = out.shape
    rows = configs.TRITON_ATTENTION_BACKWARD_DELTA["BLOCK_M"]
    tiles = _cdiv(n_q, rows)
    return Launch(attention_bwd_delta_kernel, (b * hq * tiles,),
                  dict(BLOCK_M=rows, HEAD_DIM=d, BLOCK_D=max(MIN_DOT, _pow2(d)), HAS_DLSE=has_dlse, WIDE=wide,
                       ZERO_ACC=zero_acc, num_warps=configs.TRITON_ATTENTION_BACKWARD_DELTA["num_warps"]),
                  out.device).bind(*out.stride(), *grad_out.stride(), hq, n_q, tiles)


def plan_dq_store(dq, scale: float, wide: bool, upcast: bool = False) -> Launch:
    """dq = scale · the float32 (B·Hq, Nq, D) dQ accumulator, in dq's dtype and strides: the launch,
    called as (accumulator, dq). Ends the atomic dQ mode here and the CUDA backward."""
    b, hq, n_q, d = dq.shape
    rows = configs.TRITON_ATTENTION_BACKWARD_DELTA["BLOCK_M"]
    tiles = _cdiv(n_q, rows)
    return Launch(attention_bwd_dq_store_kernel, (b * hq * tiles,),
                  dict(BLOCK_M=rows, HEAD_DIM=d, BLOCK_D=max(MIN_DOT, _pow2(d)), WIDE=wide, UPCAST=upcast,
                       num_warps=configs.TRITON_ATTENTION_BACKWARD_DELTA["num_warps"]),
                  dq.device).bind(*dq.stride(), hq, n_q, scale, tiles)


def plan_finish(dq, dk, dv, scale: float, splits: int, wide: bool, upcast: bool = False) -> Launch:
    """dq = scale · the float32 dQ accumulator, and dk, dv = the sums of their `splits` float32 partials
    (attention_bwd_finish_kernel), in one launch, called as (accumulator, dq, partials, dk, dv):
    the end of the CUDA backward with its GQA groups split (kv_split)."""
    b, hq, n_q, d = dq.shape
    hkv, n_k = dk.shape[1], dk.shape[2]
    rows = configs.TRITON_ATTENTION_BACKWARD_DELTA["BLOCK_M"]
    block_d = max(MIN_DOT, _pow2(d))
    keys = max(8, min(rows, 2048 // block_d))  # 16 float32 a thread per accumulator (4 warps)
    m_tiles, n_tiles = _cdiv(n_q, rows), _cdiv(n_k, keys)
    dq_programs = b * hq * m_tiles
    wide = wide or max(max(dk.stride()), max(dv.stride())) >= WIDE_STRIDE
    return Launch(attention_bwd_finish_kernel, (dq_programs + b * hkv * n_tiles,),
                  dict(SPLITS=splits, BLOCK_M=rows, BLOCK_N=keys, HEAD_DIM=d, BLOCK_D=block_d, WIDE=wide,
                       UPCAST=upcast, num_warps=configs.TRITON_ATTENTION_BACKWARD_DELTA["num_warps"]),
                  dq.device).bind(*dq.stride(), *dk.stride(), *dv.stride(), hq, n_q, scale, m_tiles, hkv, n_k,
                                  n_tiles, dq_programs, splits * b * hkv * n_k * d)


def plan_backward_ext(q, k, v, out, grad_out, dq, dk, dv, scale: float, causal: bool, causal_offset: int,
                      has_dlse: bool, mods):
    """The backward with `mods` (attention_bwd_ext.py): delta as the dense plan, then the dK/dV and
    dQ ext kernels (dQ by its own pass: bitwise-repeatable). Varlen tensors are the (1, H, total,
    D) views of the forward's plan; the grid runs mods.varlen's sequences."""
    hq = q.shape[1]
    hkv = k.shape[1]
    device = q.device
    interpret = device.type != "cuda" or interpreted(attention_bwd_dq_ext_kernel)
    if mods.varlen is not None:
        b, max_q, max_k = mods.varlen
        n_q, n_k = q.shape[2], k.shape[2]
    else:
        b, n_q, n_k = q.shape[0], q.shape[2], k.shape[2]
        max_q, max_k = n_q, n_k
    has_left, has_right, left, right = _window_flags(mods, causal, causal_offset, max_q, max_k)
    strides = [t.stride() for t in (q, k, v, out, grad_out, dq, dk, dv)]
    if mods.varlen is not None:  # one packed sequence per "batch": no batch stride
        strides = [(0,) + tuple(st[1:]) for st in strides]
    wide = max(max(st) for st in strides) >= WIDE_STRIDE
    sq, sk, sv, so, sdo, sdq, sdk, sdv = strides
    qk_scale = scale * online.LOG2E
    cap = mods.softcap
    cap_in, cap_out = (scale / cap, cap * online.LOG2E) if cap > 0 else (1.0, 1.0)
    stride_mb, stride_mn = mods.mask_strides
    extra = (max(mods.alibi_stride, 0), stride_mb, stride_mn)
    mod_const = dict(HAS_LEFT=has_left, HAS_RIGHT=has_right, SOFTCAP=cap > 0, ALIBI=mods.alibi_stride >= 0,
                     KEY_MASK=mods.key_mask, VARLEN=mods.varlen is not None)
    dkdv = launch_constants(q, "dkdv", interpret, causal)
    dqc = launch_constants(q, "dq", interpret, causal)
    for c in (dkdv, dqc):
        del c["CAUSAL"]
        c.pop("ATOMIC_DQ", None)
        c.pop("BAND", None)  # the dense dK/dV kernel's causal loop structure
        c.update(mod_const, ACCURATE=c["PRECISION"] == "ieee", WIDE=wide)
    n_tiles = _cdiv(max_k, dkdv["BLOCK_N"])
    m_tiles = _cdiv(max_q, dqc["BLOCK_M"])
    # delta on the tensors as they are: (1, Hq, total_q) for varlen is lse's (Hq, total_q) layout.
    dq_b, dq_n = q.shape[0], q.shape[2]
    delta = plan_delta(out, grad_out, has_dlse, wide)
    dkdv_launch = Launch(attention_bwd_dkdv_ext_kernel, (b * hkv * n_tiles,), dkdv, device).bind(
        *sq, *sk, *sv, *sdo, *sdk, *sdv, *extra, hkv, hq // hkv, n_q, n_k, causal_offset, left, right, qk_scale,
        scale, cap_in, cap_out, n_tiles)
    dq_launch = Launch(attention_bwd_dq_ext_kernel, (b * hq * m_tiles,), dqc, device).bind(
        *sq, *sk, *sv, *sdo, *sdq, *extra, hq, hq // hkv, n_q, n_k, causal_offset, left, right, qk_scale,
        scale, cap_in, cap_out, m_tiles)
    delta_size = dq_b * hq * dq_n
    bool_mask = mods.key_mask == 1

    def run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv, slopes=None, key_mask=None, cu_q=None, cu_k=None):
        if bool_mask:
            key_mask = key_mask.view(torch.uint8)
        slopes, key_mask, cu_q, cu_k = (lse if t is None else t for t in (slopes, key_mask, cu_q, cu_k))
        ws = torch.empty(delta_size, dtype=torch.float32, device=device)
        delta(out, grad_out, lse if grad_lse is None else grad_lse, ws, ws)
        dkdv_launch(q, k, v, grad_out, lse, ws, dk, dv, slopes, key_mask, cu_q, cu_k)
        dq_launch(q, k, v, grad_out, lse, ws, dq, slopes, key_mask, cu_q, cu_k)
    return run


def attention_backward(q, k, v, out, lse, grad_out, dq, dk, dv, scale: float, causal: bool,
                       causal_offset: int, grad_lse=None, deterministic: bool = False) -> None:
    """Fill dq, dk, dv (preallocated, any strides) with the gradients of attention of q over k, v
    given the forward's out and lse and the output's gradient (and lse's, if any). Planned for this
    one call: the tests call it; ta.attention's autograd caches the plan."""
    plan_backward(q, k, v, out, grad_out, dq, dk, dv, scale, causal, causal_offset,
                  grad_lse is not None, deterministic)(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv)
