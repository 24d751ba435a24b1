"""ta.attention and ta.scaled_dot_product_attention: validate → a cached plan → launch (DESIGN §3).

Masking is one integer: with `causal`, query i sees key j iff j <= i + causal_offset. ta.attention
uses offset Nk − Nq (bottom-right, flash-attn ≥ 2.1); ta.scaled_dot_product_attention uses 0
(torch's top-left `is_causal`).

One call, eager on plain tensors (tiled_attn/_plan.py says when a call is that):
    attention(q, k, v, ...)  →  _PLANS[signature]  (a miss: _resolve validates in full, then plans)
                             →  AttentionPlan.forward(q, k, v): allocate out and lse, run the
                                backend's launches (tiled_attn/triton/attention.py plan_forward,
                                tiled_attn/cuda/attention.py plan_forward).
scaled_dot_product_attention caches its own plan per signature too: which calls go to torch's SDPA
(a tensor mask, dropout, layouts only torch gives a meaning to) and, for the others, the attention
plan of the 4-D (B, H, N, D) views. Traced calls (torch.compile, make_fx, ...) validate and go
through the op `tiled_attn::attention_fwd` (torch.library.define + impl + register_fake), whose
implementation runs the same plans.

A call that needs a gradient goes through `_Attention`, an autograd.Function outside the ops
(DESIGN §6). Its backward is planned like a forward: AttentionBackwardPlan per signature (the
Triton backward kernels for backends "triton" and "cuda", reference.blockwise_attention_backward
for "torch"), eager on plain tensors directly, traced through the op `tiled_attn::attention_bwd`.

Backends fill preallocated outputs: `out` is laid out (B, Nq, H, D) in memory and returned as its
(B, H, Nq, D) transpose, so a module's `out.transpose(1, 2).reshape(B, N, H*D)` is free; `lse` is a
contiguous (B, H, Nq) float32 tensor in natural-log units. backend=None on the CPU runs torch's own
SDPA (its fused CPU kernel; DESIGN §3: the fastest there) wherever it computes the same thing: no
lse asked for, and every query row sees at least one key; else the pure-PyTorch torch backend.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from . import _checks, _mods, _plan, configs, reference
from ._mods import Mods

__all__ = ["attention", "scaled_dot_product_attention", "masked_attention", "Mods"]

# backend=None on the CPU: torch's own F.scaled_dot_product_attention (not a name users pass).
NATIVE = "native"


def _default_backend(q: torch.Tensor) -> str:
    if q.dtype == torch.float64:
        return "torch"
    return configs.DEFAULT_BACKEND[("attention", q.device.type)]


def _alloc(q: torch.Tensor, v: torch.Tensor):
    b, h, nq, _ = q.shape
    dv = v.shape[-1]
    out = torch.empty_strided((b, h, nq, dv), (nq * h * dv, dv, h * dv, 1), dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, nq, dtype=_lse_dtype(q.dtype), device=q.device)
    return out, lse


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs (the torch backend; float64 gradcheck recomputes P
    from it)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grad_alloc(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The gradient of q, k or v (in t's dtype, or `dtype`): t's own layout where t is dense, else
    (B, N, H, D) memory like the forward's output (a head-split view of a packed projection: its
    gradient then reshapes back to (B, N, H·D) as a view)."""
    dtype = t.dtype if dtype is None else dtype
    g = torch.empty_like(t, dtype=dtype)  # keeps t's strides exactly when t is dense and non-overlapping
    if g.stride() == t.stride():
        return g
    b, h, n, d = t.shape
    return torch.empty_strided((b, h, n, d), (n * h * d, d, h * d, 1), dtype=dtype, device=t.device)


def _effective_offset(causal: bool, offset: int, nq: int, nk: int) -> tuple[bool, int]:
    """(causal, offset) with the mask dropped where every query sees every key."""
    return (False, 0) if not causal or offset >= nk - 1 else (True, offset)


# ------------------------------------------------------------------------------------------------
# plans
# ------------------------------------------------------------------------------------------------
class AttentionPlan:
    """A validated signature's forward: the backend, the outputs' layout and the launches."""

    __slots__ = ("backend", "size", "stride", "dtype", "device", "lse_size", "lse_stride", "scale",
                 "causal", "offset", "empty", "run", "run_out", "planner", "native_kw", "mods", "store_lse",
                 "backends", "bwd")

    def __init__(self, q, k, v, scale: float, causal: bool, causal_offset: int, backend: str,
                 mods: Mods | None = None, store_lse: bool = True):
        self.backend, self.scale = backend, scale
        self.backends = backend  # (forward, backward) where they differ: _plan_for sets it
        # The backward plans of this forward's calls (_Attention.backward), by what the forward's
        # signature leaves open: dO's strides and `deterministic`.
        self.bwd = {}
        self.causal, self.offset, self.mods = causal, causal_offset, mods
        # store_lse=False (a plan with mods on the Triton backend, for a caller that never wants
        # lse: the KV-cache API without return_lse): forward allocates and writes out alone.
        self.store_lse = store_lse or backend != "triton" or mods is None
        out, lse = _alloc(q, v)
        self.size, self.stride, self.dtype, self.device = out.shape, out.stride(), q.dtype, q.device
        self.lse_size, self.lse_stride = lse.shape, lse.stride()
        # Nothing to compute: no query rows, or no keys (every row empty: output 0, lse -inf).
        self.empty = "rows" if q.numel() == 0 else "keys" if k.shape[2] == 0 else None
        # The backend's launches: `run` writes out and lse (forward), `run_out` out alone (infer).
        # A dense plan makes each at its first use, from that call's tensors (same shapes and
        # strides: the signature): a decode loop makes a plan per step (the key length grows) and
        # uses one of the two. A plan with mods is made here, from the tensors it was planned on
        # (KV-cache calls then pass the caches in their own layout, varlen its packed views).
        self.run, self.run_out, self.native_kw, self.planner = None, None, None, None
        if self.empty is not None:
            return
        if backend == NATIVE:
            self.native_kw = _native_kwargs(q, k, scale, causal, causal_offset)
        elif backend == "torch":
            self.run = self._run_reference
        elif backend == "triton":
            from .triton import attention as triton_attention
            self.planner = functools.partial(triton_attention.plan_forward, scale=scale, causal=causal,
                                             causal_offset=causal_offset, mods=mods)
            if mods is not None:
                self.run = self.planner(q, k, v, out, lse, store_lse=self.store_lse)
        elif backend == "cuda":
            from .cuda import attention as cuda_attention
            self.planner = functools.partial(cuda_attention.plan_forward, scale=scale, causal=causal,
                                             causal_offset=causal_offset)
        else:
            raise AssertionError(backend)

    def _run_reference(self, q, k, v, out, lse, slopes=None, key_mask=None):
        kw = {} if self.mods is None else _mods.reference_kwargs(self.mods, slopes, key_mask)
        o, l = reference.blockwise_attention(q, k, v, causal=self.causal, scale=self.scale,
                                             return_lse=True, causal_offset=self.offset, **kw)
        out.copy_(o)
        lse.copy_(l)

    def forward(self, q, k, v, *extras):
        """(out, lse); lse is None on the native path (planned only where no lse is asked for)
        and in a plan made with store_lse=False."""
        if self.native_kw is not None:
            return F.scaled_dot_product_attention(q, k, v, **self.native_kw), None
        out = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        lse = (torch.empty_strided(self.lse_size, self.lse_stride, dtype=_lse_dtype(self.dtype), device=self.device)
               if self.store_lse else None)
        if _checks.POISON_OUTPUTS:
            out.fill_(float("nan"))
            if lse is not None:
                lse.fill_(float("nan"))
        run = self.run
        if run is None and self.planner is not None:
            run = self.run = self.planner(q, k, v, out, lse)
        if run is not None:
            run(q, k, v, out, out if lse is None else lse, *extras)
        elif self.empty == "keys":
            out.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
        return out, lse

    def infer(self, q, k, v):
        """out alone, for a call that asked for no lse and records no gradient. The Triton kernels
        then write no lse, so the call allocates one tensor, not two (an eager inference call's
        host time is mostly such steps: DESIGN §3); other backends and plans with mods run
        forward."""
        run = self.run_out
        if run is None:
            if self.backend != "triton" or self.mods is not None or self.planner is None:
                return self.forward(q, k, v)[0]
        out = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        if _checks.POISON_OUTPUTS:
            out.fill_(float("nan"))
        if run is None:
            run = self.run_out = self.planner(q, k, v, out, out, store_lse=False)
        run(q, k, v, out, out)
        return out


def _native_kwargs(q, k, scale: float, causal: bool, causal_offset: int) -> dict:
    """F.scaled_dot_product_attention's arguments for our call (a mask _backend_for admitted)."""
    nq, nk = q.shape[2], k.shape[2]
    causal, offset = _effective_offset(causal, causal_offset, nq, nk)
    kw = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if causal and offset == 0:  # torch's top-left is_causal
        kw["is_causal"] = True
    elif causal:  # offset == Nk - Nq > 0, bottom-right: query i sees keys j <= i + offset
        kw["attn_mask"] = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(offset)
    return kw


def _backend_for(q, k, causal: bool, causal_offset: int, need_lse: bool, backend, mods=None, v=None) -> str:
    if backend is not None:
        return backend
    if mods is not None:  # torch's SDPA has no window/softcap/ALiBi of ours: the torch backend on the CPU
        return _default_backend(q)
    nq, nk = q.shape[2], k.shape[2]
    # Masks torch's SDPA states: none, top-left (offset 0) or bottom-right (offset Nk - Nq), where
    # every row sees a key (so its result is defined and the same as ours).
    same_mask = not causal or causal_offset == 0 or causal_offset == nk - nq >= 0
    if q.device.type == "cpu" and not need_lse and same_mask:
        return NATIVE
    return _measured_choice(q, k, v, causal) or _default_backend(q)


def _measured_choice(q, k, v, causal: bool) -> str | None:
    """backend=None's backend from configs.ATTENTION_SELECT where a row applies (see there): a CUDA
    device, fp16/bf16, concrete shapes (a symbolic one keeps the default rather than guard on the
    table's bounds), and for a "cuda" row q, k, v its kernels read in place and an extension that
    can be built here. None: the default."""
    if (q.device.type != "cuda" or v is None or q.dtype not in (torch.float16, torch.bfloat16)
            or not all(type(s) is int for s in (*q.shape, *k.shape))):
        return None
    row = configs.attention_select(configs.arch(q.device), q.shape[-1], causal, min(q.shape[2], k.shape[2]))
    if row is None or row[0] != "cuda":
        return row and row[0]
    from . import cuda
    from .cuda import attention as cuda_attention
    if not cuda.is_available() or not all(cuda_attention.reads_in_place(t) for t in (q, k, v)):
        return None
    return "cuda"


_PLANS = _plan.PlanCache("attention")


def _plan_for(q, k, v, scale, causal: bool, causal_offset: int, need_lse: bool, backend, mods=None):
    """The plan of this call's signature (plain tensors): a hit means the same signature was
    validated before; a miss validates (DESIGN §5) and plans. `mods` (validated by the caller,
    tiled_attn/_mods.py) is part of the signature."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
           q.device, k.device, v.device, scale, type(scale), causal, type(causal), causal_offset, need_lse,
           backend, mods)
    try:
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable argument: validation names it
        key = plan = None
    if plan is None:
        asked = backend
        scale, backend = _resolve(q, k, v, scale, causal, causal_offset, need_lse, backend, mods)
        plan = _PLANS.put(key, AttentionPlan(q, k, v, scale, causal, causal_offset, backend, mods))
        if mods is None:
            plan.backends = _with_backward(q, asked, backend)
    return plan


def _with_backward(q, asked, backend):
    """What _Attention runs: the forward's backend, or (forward, backward) where backend=None's
    backward is another: "cuda"'s wgmma backward wherever it covers the call on this device
    (tiled_attn/cuda/attention_backward.py `selected`; measured faster than the Triton backward
    at every point of benchmarks/tune_cuda_attention_backward.py, H100, 2026-11-28), whichever
    forward configs.ATTENTION_SELECT picked. An explicit backend runs its own backward."""
    if asked is not None or backend != "triton" or q.device.type != "cuda":
        return backend
    from .cuda import attention_backward as cuda_backward
    return (backend, "cuda") if cuda_backward.selected(q) else backend


def _resolve(q, k, v, scale, causal, causal_offset: int, need_lse: bool, backend, mods=None) -> tuple[float, str]:
    """Validate (DESIGN §5) and pick what runs: (scale, backend). Loads the CUDA extension when
    that backend is chosen (a plan is being made, or a traced call)."""
    _checks.check_attention(q, k, v, scale, backend)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if mods is not None and backend == "cuda":
        raise ValueError("backend='cuda' has no window, softcap, alibi_slopes, key mask, varlen or KV "
                         "cache: use backend=None or backend='triton' for these")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    backend = _backend_for(q, k, causal, causal_offset, need_lse, backend, mods, v)
    if backend == "cuda":
        from . import cuda
        cuda.require_attention(q)
    return scale, backend


# ------------------------------------------------------------------------------------------------
# the op (for tracing) and autograd
# ------------------------------------------------------------------------------------------------
torch.library.define("tiled_attn::attention_fwd",
                     "(Tensor q, Tensor k, Tensor v, float scale, bool causal, int causal_offset, "
                     "str backend) -> (Tensor, Tensor)")


@torch.library.impl("tiled_attn::attention_fwd", "CompositeExplicitAutograd")
def _attention_impl(q, k, v, scale, causal, causal_offset, backend):
    return _plan_for(q, k, v, scale, causal, causal_offset, True, backend).forward(q, k, v)


@torch.library.register_fake("tiled_attn::attention_fwd")
def _(q, k, v, scale, causal, causal_offset, backend):
    return _alloc(q, v)


_attention_op = torch.ops.tiled_attn.attention_fwd.default


_Tensor = torch.Tensor


def _plain(q, k, v) -> bool:
    """Eager on plain tensors: the plan path (tiled_attn/_plan.py)."""
    return type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor and _plan.eager()


def _grad_needed(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _forward(q, k, v, scale, causal, causal_offset, backend, mods=None, extras=()):
    if mods is not None:
        return _plan_for(q, k, v, scale, causal, causal_offset, True, backend, mods).forward(q, k, v, *extras)
    if _plain(q, k, v):
        return _plan_for(q, k, v, scale, causal, causal_offset, True, backend).forward(q, k, v)
    return _attention_op(q, k, v, scale, causal, causal_offset, backend)


# ------------------------------------------------------------------------------------------------
# the backward: a plan per signature, the op (for tracing), the autograd.Function
# ------------------------------------------------------------------------------------------------
class AttentionBackwardPlan:
    """A signature's backward: (dq, dk, dv) from q, k, v, the forward's out and lse, the output's
    gradient and (has_dlse) lse's. Backend "triton" runs the Triton backward kernels
    (tiled_attn/triton/attention_backward.py); "cuda" its wgmma backward where it covers the call
    (tiled_attn/cuda/attention_backward.py: sm_90a, D 64/128, not deterministic), else the Triton
    ones; "torch" the tiled PyTorch one (reference.blockwise_attention_backward). The Triton dQ is
    its own pass (bitwise-repeatable) or float32 atomics, by the config row; the wgmma dQ is float32
    atomic adds (TMA reduce-adds); `deterministic` forces the Triton pass. `grad_dtype`: the
    gradients' dtype (None: the inputs'); float32 for 16-bit inputs gives unrounded partials (the
    context-parallel ring sums one per block: distributed._ring_backward)."""

    __slots__ = ("backend", "scale", "causal", "offset", "empty", "run", "layouts", "mods", "fast", "fast_tries")

    def __init__(self, q, k, v, out, grad_out, scale: float, causal: bool, causal_offset: int,
                 has_dlse: bool, backend: str, deterministic: bool, mods: Mods | None = None,
                 grad_dtype: torch.dtype | None = None):
        self.backend, self.scale, self.causal, self.offset = backend, scale, causal, causal_offset
        self.mods = mods
        grads = [_grad_alloc(t, grad_dtype) for t in (q, k, v)]
        self.layouts = [(g.shape, g.stride(), g.dtype) for g in grads]
        # No query rows or no keys: nothing flows (every gradient is zero).
        self.empty = q.numel() == 0 or k.numel() == 0
        self.run = None
        # The C++ path of the launches (run.register_fast: the wgmma or the Triton backward's): made
        # after a call without lse's gradient, then each call is one C++ call (None: it declined).
        # fast_tries: registrations left to try (a kernel's aligned build may not exist yet).
        self.fast, self.fast_tries = None, 0
        if self.empty or backend == "torch":
            return
        if backend not in ("triton", "cuda"):
            raise AssertionError(backend)
        if backend == "cuda":  # its wgmma backward where it covers the call (sm_90a), else Triton's
            from .cuda import attention_backward as cuda_backward
            self.run = cuda_backward.plan_backward(q, k, v, out, grad_out, *grads, scale, causal,
                                                   causal_offset, has_dlse, deterministic, mods)
        if self.run is None:
            from .triton import attention_backward as triton_backward
            self.run = triton_backward.plan_backward(q, k, v, out, grad_out, *grads, scale, causal,
                                                     causal_offset, has_dlse, deterministic, mods=mods)
        if (hasattr(self.run, "register_fast") and not has_dlse and grad_dtype is None and _plan.FAST_LAUNCH
                and q.device.type == "cuda"):
            self.fast_tries = 3

    def backward(self, q, k, v, out, lse, grad_out, grad_lse, *extras):
        if self.fast is not None:  # C++ allocates and launches (None: it declined this call)
            grads = _bwd_fast(self.fast, q, k, v, out, lse, grad_out, _plan.current_stream(q.device.index),
                              _checks.POISON_OUTPUTS)
            if grads is not None:
                return grads
        dq, dk, dv = (torch.empty_strided(size, stride, dtype=dtype, device=t.device)
                      for (size, stride, dtype), t in zip(self.layouts, (q, k, v)))
        if self.empty:
            return dq.zero_(), dk.zero_(), dv.zero_()
        if self.run is None:  # the torch backend
            kw = {} if self.mods is None else _mods.reference_kwargs(self.mods, *(extras + (None, None))[:2])
            grads = reference.blockwise_attention_backward(q, k, v, out, lse, grad_out, grad_lse,
                                                           self.causal, self.scale, self.offset, **kw)
            for g, r in zip((dq, dk, dv), grads):
                g.copy_(r)
            return dq, dk, dv
        if _checks.POISON_OUTPUTS:
            for g in (dq, dk, dv):
                g.fill_(float("nan"))
        self.run(q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv, *extras)
        if self.fast_tries:
            self._register_fast(q, k, v, out, lse, grad_out, dq, dk, dv)
        return dq, dk, dv

    def _register_fast(self, *tensors) -> None:
        """After a call on `tensors` (q, k, v, out, lse, grad_out, dq, dk, dv): the C++ path of this
        plan's launches (run.register_fast), through the extension the softmax's C++ launches use
        (tiled_attn/softmax.py _fast_extension: none where it cannot be built or
        TILED_ATTN_FAST_LAUNCH=0; the Python path then stays). Only from a call whose tensors are all
        16-byte aligned (what a call of the C++ path must have; it declines others), up to three
        tries: run.register_fast returns None while a launch's aligned build does not exist yet."""
        global _bwd_fast, fast_backward_refused
        self.fast_tries -= 1
        if any(t.data_ptr() % 16 for t in tensors):
            return
        from .softmax import _fast_extension
        ext = _fast_extension(tensors[0].device)
        try:
            if ext is None:
                raise RuntimeError("no CUDA extension for C++ launches here")
            self.fast = self.run.register_fast(ext, *tensors)
        except (RuntimeError, ValueError, TypeError) as e:  # refused: this plan keeps the Python path
            fast_backward_refused = f"{type(e).__name__}: {e}"
            self.fast_tries = 0
        if self.fast is not None:
            self.fast_tries = 0
            if _bwd_fast is None:
                _bwd_fast = ext.attention_bwd_fast


_BACKWARD_PLANS = _plan.PlanCache("attention backward")
_bwd_fast = None  # the extension's attention_bwd_fast, once a plan registered with it
fast_backward_refused: str | None = None  # the last registration's error, for tests and users


def _backward_plan(q, k, v, out, grad_out, grad_lse, scale, causal, causal_offset, backend, deterministic,
                   mods=None, grad_dtype=None):
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.stride(), grad_out.stride(),
           None if grad_lse is None else grad_lse.stride(), q.dtype, q.device, scale, causal,
           causal_offset, backend, deterministic, mods, grad_dtype)
    plan = _BACKWARD_PLANS.get(key)
    if plan is None:
        plan = _BACKWARD_PLANS.put(key, AttentionBackwardPlan(q, k, v, out, grad_out, scale, causal,
                                                              causal_offset, grad_lse is not None, backend,
                                                              deterministic, mods, grad_dtype))
    return plan


def _backward_impl(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend,
                   deterministic, mods=None, extras=(), grad_dtype=None):
    # Autograd hands what the graph made: a gradient of another dtype (autocast, a float32 loss)
    # or an lse gradient with any layout. The kernels read dO through its strides (an expanded
    # gradient, stride 0, is read in place) and dlse as a contiguous float32 (B, H, Nq).
    if grad_out.dtype != q.dtype:
        grad_out = grad_out.to(q.dtype)
    if grad_lse is not None:
        grad_lse = grad_lse.to(lse.dtype).contiguous()
    return _backward_plan(q, k, v, out, grad_out, grad_lse, scale, causal, causal_offset, backend, deterministic,
                          mods, grad_dtype).backward(q, k, v, out, lse, grad_out, grad_lse, *extras)


torch.library.define("tiled_attn::attention_bwd",
                     "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                     "Tensor? grad_lse, float scale, bool causal, int causal_offset, str backend, "
                     "bool deterministic) -> (Tensor, Tensor, Tensor)")


@torch.library.impl("tiled_attn::attention_bwd", "CompositeExplicitAutograd")
def _attention_bwd_impl(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend,
                        deterministic):
    return _backward_impl(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend,
                          deterministic)


@torch.library.register_fake("tiled_attn::attention_bwd")
def _(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend, deterministic):
    return _grad_alloc(q), _grad_alloc(k), _grad_alloc(v)


_attention_bwd_op = torch.ops.tiled_attn.attention_bwd.default


def _backward(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend, deterministic,
              mods=None, extras=()):
    if mods is not None:
        return _backward_impl(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend,
                              deterministic, mods, extras)
    if (_plain(q, k, v) and type(grad_out) is _Tensor and type(out) is _Tensor
            and (grad_lse is None or type(grad_lse) is _Tensor)):
        return _backward_impl(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend,
                              deterministic)
    return _attention_bwd_op(grad_out, q, k, v, out, lse, grad_lse, scale, causal, causal_offset, backend,
                             deterministic)


class _Attention(torch.autograd.Function):
    """The forward with autograd recording; the backward is the tiled one (P recomputed from the
    saved lse). `lse_grad`: lse is returned to the caller (return_lse), so its gradient flows too;
    otherwise it is marked non-differentiable and its (zero) gradient is never read.
    `deterministic`: bitwise-repeatable gradients (the Triton dQ by its own pass, no atomics)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, causal_offset, backend, lse_grad, deterministic, mods=None,
                *extras):
        # backend: one name, (forward's, backward's) from a plan's `backends` (backend=None), or an
        # eager call's AttentionPlan, whose forward runs here without a second plan lookup.
        if isinstance(backend, AttentionPlan):
            plan, backend = backend, backend.backends
            out, lse = plan.forward(q, k, v, *extras)
            backend, bwd_backend = backend if isinstance(backend, tuple) else (backend, backend)
        else:
            plan = None
            backend, bwd_backend = backend if isinstance(backend, tuple) else (backend, backend)
            out, lse = _forward(q, k, v, scale, causal, causal_offset, backend, mods, extras)
        ctx.save_for_backward(q, k, v, out, lse, *extras)
        ctx.plan = plan if mods is None else None
        ctx.scale, ctx.causal, ctx.causal_offset, ctx.backend = scale, causal, causal_offset, bwd_backend
        ctx.lse_grad, ctx.deterministic, ctx.mods, ctx.n_extras = lse_grad, deterministic, mods, len(extras)
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        # An output the loss does not reach comes to the backward as None, not as a zeros tensor
        # the engine would allocate and fill (a launch on every training step for lse).
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, *extras = ctx.saved_tensors
        if grad_out is None:  # only lse reaches the loss (return_lse): dO = 0
            grad_out = torch.zeros_like(out)
        grad_lse = grad_lse if ctx.lse_grad else None
        plan = ctx.plan
        if (plan is not None and grad_lse is None and type(grad_out) is _Tensor and grad_out.dtype is q.dtype
                and not torch.is_grad_enabled()):
            # An eager call's backward (the engine's default, create_graph=False): its plan by the
            # forward plan's key (q, k, v and out are the forward's) and dO's strides.
            key = (grad_out.stride(), ctx.deterministic)
            bwd = plan.bwd.get(key)
            if bwd is None:
                bwd = plan.bwd[key] = _backward_plan(q, k, v, out, grad_out, None, ctx.scale, ctx.causal,
                                                     ctx.causal_offset, ctx.backend, ctx.deterministic)
            return tuple(bwd.backward(q, k, v, out, lse, grad_out, None)) + (None,) * 7
        args = (grad_out, q, k, v, out, lse, grad_lse, ctx.scale, ctx.causal, ctx.causal_offset, ctx.backend,
                ctx.deterministic, ctx.mods, tuple(extras))
        if not torch.is_grad_enabled():  # the engine's default (create_graph=False)
            return tuple(_backward(*args)) + (None,) * (7 + ctx.n_extras)
        with torch.no_grad():
            dq, dk, dv = _backward(*args)
        # create_graph=True: a double backward must raise, not be wrong
        dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, q, k, v, grad_out)
        return (dq, dk, dv, None, None, None, None, None, None, None) + (None,) * ctx.n_extras


class _NoDoubleBackward(torch.autograd.Function):
    """The first-order gradients, made part of a graph whose backward raises: the attention
    backward is not itself differentiable (its kernels treat out and lse as constants)."""

    @staticmethod
    def forward(ctx, dq, dk, dv, q, k, v, grad_out):
        return dq.view_as(dq), dk.view_as(dk), dv.view_as(dv)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("tiled_attn.attention supports first-order gradients only: a double "
                           "backward (create_graph=True, then differentiating the gradients) is "
                           "not implemented")


def _traced(q, k, v, scale, causal, causal_offset, need_lse, backend, deterministic=False):
    """Any call that is not eager on plain tensors: validate, then the op (Dynamo keeps it as one
    node; its fake implementation gives shapes), or torch's SDPA where that is backend=None's
    choice (the CPU)."""
    asked = backend
    scale, backend = _resolve(q, k, v, scale, causal, causal_offset, need_lse, backend)
    if backend == NATIVE:
        if k.shape[2] == 0:  # every row empty: output 0 (torch's SDPA is undefined there)
            return q.new_zeros(q.shape[:3] + v.shape[3:]), None
        return F.scaled_dot_product_attention(q, k, v, **_native_kwargs(q, k, scale, causal, causal_offset)), None
    if _grad_needed(q, k, v):
        return _Attention.apply(q, k, v, scale, causal, causal_offset, _with_backward(q, asked, backend), need_lse,
                                deterministic)
    return _attention_op(q, k, v, scale, causal, causal_offset, backend)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, window=None, softcap: float | None = None,
              alibi_slopes: torch.Tensor | None = None, return_lse: bool = False,
              deterministic: bool = False, backend: str | None = None):
    """softmax(q kᵀ · scale) v, blocked, with the online softmax fused into the key loop.

    Args:
        q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 (GQA/MQA by index, never
           repeated). Any Nq, Nk ≥ 0, D ≤ 256, float16/bfloat16/float32, any strides.
        causal: bottom-right aligned like flash-attn ≥ 2.1: query i sees key j iff
           j <= i + Nk − Nq. Rows that see no key (Nq > Nk) give output 0 and lse -inf.
        scale: defaults to 1/sqrt(D).
        window: (left, right), flash-attn's window_size: query i sees keys j with
           i + Nk − Nq − left <= j <= i + Nk − Nq + right; -1 leaves a side unbounded. With
           causal=True the right edge is 0 whatever right says. Key tiles outside every row's
           window are never visited, so the cost grows with the window, not with Nk.
        softcap: c > 0 turns the scaled scores s into c·tanh(s / c) before the softmax (Gemma 2).
        alibi_slopes: float32 (Hq,) or (B, Hq): adds −slope·|i + Nk − Nq − j| to the (capped) scores.
        return_lse: also return lse (B, Hq, Nq) float32, natural log of Σ_j exp(scale·q·k_j).
        backend: None (the fastest measured for the device: "triton" on CUDA; on the CPU torch's
           own SDPA where it computes the same, else "torch"), "triton", "cuda", "torch"
           (blockwise online attention in PyTorch: the reference).

        deterministic: gradients bitwise-identical from run to run (dQ by its own pass). Without
           it the Triton backward may add dQ with float32 atomics where the config table says that
           is faster (configs.TRITON_ATTENTION_BACKWARD, "dq"), and the CUDA wgmma backward always
           does; their last bits vary between runs.

    Differentiable with respect to q, k and v (and through lse when return_lse=True): the tiled
    backward recomputes P from q, k and the saved lse, never an N×N tensor; dK/dV are summed over
    each GQA group inside the kernels. Backend "triton" runs the Triton backward kernels;
    "cuda", and backend=None on a CUDA device whichever forward it picked, the wgmma backward on
    an H100 for D 64/128 in fp16/bf16 (dQ by float32 atomic adds; configs.CUDA_ATTENTION_BACKWARD) and
    the Triton kernels elsewhere or with deterministic=True; "torch" the PyTorch one; on the CPU's
    native path (torch's SDPA) torch's autograd does it. On a grid of about one CTA per SM (a batch-1
    GQA training step) the wgmma backward may split each group's query heads among CTAs: float32
    partial dK/dV, at most a small multiple of the SM count's worth of key tiles, summed in a fixed
    order (tiled_attn/cuda/attention_backward.py `schedule`).
    """
    if deterministic is not False and deterministic is not True:
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    try:
        offset = k.shape[2] - q.shape[2]
    except (AttributeError, IndexError, TypeError):
        offset = 0  # not 4-D tensors: validation names what is wrong
    if window is not None or softcap is not None or alibi_slopes is not None:
        _checks.check_attention(q, k, v, scale, backend)
        mods = _mods.make(window, softcap, alibi_slopes, q, q.shape[0])
        if not mods.plain:
            out, lse = _attention_mods(q, k, v, scale, causal, offset, return_lse, backend, deterministic,
                                       mods, (alibi_slopes, None))
            return (out, lse) if return_lse else out
    if _plain(q, k, v):
        plan = _plan_for(q, k, v, scale, causal, offset, return_lse, backend)
        if plan.native_kw is not None or not _grad_needed(q, k, v):
            if not return_lse:
                return plan.infer(q, k, v)
            out, lse = plan.forward(q, k, v)
        else:
            out, lse = _Attention.apply(q, k, v, plan.scale, causal, offset, plan, return_lse, deterministic)
    else:
        out, lse = _traced(q, k, v, scale, causal, offset, return_lse, backend, deterministic)
    return (out, lse) if return_lse else out


@_plan.eager_only
def _attention_mods(q, k, v, scale, causal, offset: int, need_lse: bool, backend, deterministic: bool,
                    mods: Mods, extras: tuple):
    """ta.attention / masked_attention with a window, softcap, ALiBi or a key mask: the plan of
    the signature plus mods, our autograd where a gradient is needed. (Not traced by torch.compile, nor
    anything it calls: a graph break, the call runs eagerly.)"""
    plan = _plan_for(q, k, v, scale, causal, offset, need_lse, backend, mods)
    if not _grad_needed(q, k, v):
        return plan.forward(q, k, v, *extras)
    return _Attention.apply(q, k, v, plan.scale, causal, offset, plan, need_lse, deterministic, mods,
                            *extras)


def masked_attention(q, k, v, key_mask, *, causal: bool = False, causal_offset: int = 0, scale=None,
                     softcap=None, window=None, backend=None):
    """Attention with a per-key mask shared by every head and query of a batch row (padding):
    `key_mask` (B, Nk) bool (True: attend) or float (added to the scores), any strides.
    `causal_offset` aligns causal and the window (0: torch's top-left is_causal; Nk − Nq:
    bottom-right). For ta.scaled_dot_product_attention's key-padding masks and transformers'
    padded batches; rows that see no key give 0. Differentiable in q, k, v."""
    _checks.check_attention(q, k, v, scale, backend)
    if not isinstance(key_mask, torch.Tensor):
        raise TypeError(f"key_mask must be a tensor, got {type(key_mask).__name__}")
    b, nk = q.shape[0], k.shape[2]
    if key_mask.dim() != 2 or key_mask.shape[1] != nk or key_mask.shape[0] not in (1, b):
        raise ValueError(f"key_mask must have shape (B, Nk) = ({b}, {nk}) (or (1, Nk)), got {tuple(key_mask.shape)}")
    if key_mask.device != q.device:
        raise ValueError(f"key_mask must be on q's device {q.device}, got {key_mask.device}")
    if key_mask.dtype == torch.bool:
        kind = 1
    elif key_mask.is_floating_point():
        kind = 2
    else:
        raise TypeError(f"key_mask must be bool or floating point, got {_checks._dtype_name(key_mask.dtype)}")
    key_mask = key_mask.expand(b, nk)
    strides = (key_mask.stride(0) if b > 1 else 0, key_mask.stride(1))
    mods = _mods.make(window, softcap, None, q, b, key_mask=kind, mask_strides=strides)
    out, _ = _attention_mods(q, k, v, scale, bool(causal), int(causal_offset), False, backend, False, mods,
                             (None, key_mask))
    return out


# ------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------
def _needs_torch_sdpa(query, key, value, attn_mask, dropout_p) -> str | None:
    """Why a call must go to torch's own SDPA, or None when our kernels compute it exactly."""
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p:
        return "dropout_p > 0"
    if value.shape[-1] != query.shape[-1] or query.shape[-1] > _checks.MAX_HEAD_DIM:
        return "head dims our kernels do not cover"
    if query.dtype not in _checks.KERNEL_DTYPES:
        return "dtype"
    return None


def _torch_layout(query, key, value, enable_gqa) -> bool:
    """True when torch's broadcasting (matmul) semantics differ from our (B, H, N, D) batching:
    fewer than 3 dims, leading dims that differ (broadcast), k/v shapes that differ before the head
    dim, or heads that differ without enable_gqa other than a single shared k/v head (which torch
    broadcasts, i.e. MQA, which our kernels compute as GQA)."""
    if min(t.dim() for t in (query, key, value)) < 3 or not query.dim() == key.dim() == value.dim():
        return True
    if not query.shape[:-3] == key.shape[:-3] == value.shape[:-3]:
        return True
    if key.shape[:-1] != value.shape[:-1]:
        return True
    hq, hk = query.shape[-3], key.shape[-3]
    return not (hq == hk or hk == 1 or enable_gqa)


def _key_only_mask(query, key, value, attn_mask, enable_gqa):
    """The (B, S) view of an attn_mask that masks keys only — the same for every head and query
    of a batch row (size 1 or stride 0 along H and L after broadcasting to (B, H, L, S)), bool or
    float in the query's dtype — or None (the call goes to torch's SDPA). Padding masks are
    this; a causal or any other per-query pattern is not."""
    if (attn_mask is None or query.dim() != 4 or _torch_layout(query, key, value, enable_gqa)
            or _needs_torch_sdpa(query, key, value, None, 0.0) is not None):
        return None
    if not (attn_mask.dtype == torch.bool or attn_mask.dtype == query.dtype) or attn_mask.dim() > 4:
        return None
    b, h, l, _ = query.shape
    try:
        m = attn_mask.expand(b, h, l, key.shape[2])
    except RuntimeError:
        return None  # not broadcastable: torch's SDPA says why
    if (h > 1 and m.stride(1) != 0) or (l > 1 and m.stride(2) != 0):
        return None
    return m[:, 0, 0, :]


def _check_sdpa(query, key, value, attn_mask, is_causal, enable_gqa) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        _checks.check_tensor(name, t)
    if attn_mask is not None and is_causal:
        raise ValueError("attn_mask and is_causal cannot both be set (as in torch)")
    if (not enable_gqa and min(t.dim() for t in (query, key)) >= 3
            and query.shape[-3] != key.shape[-3] and 1 not in (query.shape[-3], key.shape[-3])):
        raise ValueError(f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass "
                         "enable_gqa=True for grouped-query attention (as in torch)")


def _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    kwargs = {"enable_gqa": enable_gqa} if enable_gqa else {}
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, **kwargs)


class _SdpaPlan:
    """One signature of ta.scaled_dot_product_attention on plain tensors without a mask: torch's
    SDPA (`attention` None) or ours on the (B, H, N, D) views (`attention`: their plan)."""

    __slots__ = ("attention", "shape4", "out_shape", "causal", "grad")

    def __init__(self, query, key, value, is_causal, scale, enable_gqa, grad: bool):
        self.attention = self.shape4 = self.out_shape = None
        self.causal = bool(is_causal)
        self.grad = grad
        if _torch_layout(query, key, value, enable_gqa) or _needs_torch_sdpa(query, key, value, None, 0.0):
            return
        batch = query.shape[:-3]
        if len(batch) != 1:  # 3-D or 5-D+: ours runs on (B, H, N, D) views (reshape: no copy here)
            # An explicit batch size, not -1: a reshape of an empty tensor cannot infer it.
            b = math.prod(batch)
            self.shape4 = [(b,) + tuple(t.shape[-3:]) for t in (query, key, value)]
            query, key, value = (t.reshape(s) for t, s in zip((query, key, value), self.shape4))
            self.out_shape = batch + (query.shape[1], query.shape[2], value.shape[3])
        self.attention = _plan_for(query, key, value, scale, bool(is_causal), 0, False, None)

    def forward(self, query, key, value):
        if self.shape4 is not None:
            query, key, value = (t.reshape(s) for t, s in zip((query, key, value), self.shape4))
        plan = self.attention
        if self.grad and plan.native_kw is None:
            out = _Attention.apply(query, key, value, plan.scale, self.causal, 0, plan, False, False)[0]
        else:
            out = plan.infer(query, key, value)
        return out if self.shape4 is None else out.reshape(self.out_shape)


_SDPA_PLANS = _plan.PlanCache("sdpa")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature and meaning, on our kernels.

    `is_causal` is top-left aligned, as in torch (query i sees key j iff j <= i). Inputs are
    (..., H, L, E) like torch's. GQA (fewer key/value heads) needs `enable_gqa=True`, as in torch;
    without it, heads that differ raise ValueError unless one side has a single head (torch
    broadcasts it).

    A boolean or float `attn_mask` that masks keys only (one (B, S) pattern broadcast over heads
    and queries, e.g. key padding) runs our kernels (masked_attention); rows it leaves without a
    key give 0, as torch's math backend. Calls with anything else our kernels do not cover go to
    torch's own SDPA, so the result always has torch's meaning: any other tensor `attn_mask`,
    `dropout_p > 0`, a value head dim different from the
    query's, a head dim over 256, float64, and shapes that only torch's broadcasting gives a meaning to (fewer
    than 3 dims, leading dims of different sizes, a query with one head against several).
    On the CPU, ours is torch's SDPA too (backend=None's choice there, see ta.attention).
    Inputs that require grad run our forward and backward kernels (ta.attention's autograd).
    """
    if attn_mask is None and not dropout_p and _plain(query, key, value):
        grad = _grad_needed(query, key, value)
        sig = (query.shape, query.stride(), key.shape, key.stride(), value.shape, value.stride(),
               query.dtype, key.dtype, value.dtype, query.device, key.device, value.device,
               is_causal, type(is_causal), scale, type(scale), enable_gqa, type(enable_gqa), grad)
        try:
            plan = _SDPA_PLANS.get(sig)
        except TypeError:
            sig = plan = None
        if plan is None:
            _check_sdpa(query, key, value, None, is_causal, enable_gqa)
            plan = _SDPA_PLANS.put(sig, _SdpaPlan(query, key, value, is_causal, scale, enable_gqa, grad))
        if plan.attention is not None:
            return plan.forward(query, key, value)
        return _torch_sdpa(query, key, value, None, dropout_p, is_causal, scale, enable_gqa)
    _check_sdpa(query, key, value, attn_mask, is_causal, enable_gqa)
    key_mask = None if dropout_p else _key_only_mask(query, key, value, attn_mask, enable_gqa)
    if key_mask is not None:
        return masked_attention(query, key, value, key_mask, scale=scale)
    if (_torch_layout(query, key, value, enable_gqa)
            or _needs_torch_sdpa(query, key, value, attn_mask, dropout_p) is not None):
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    batch_shape = query.shape[:-3]
    b = math.prod(batch_shape)
    q, k, v = (t.reshape((b,) + tuple(t.shape[-3:])) for t in (query, key, value))
    out, _ = _traced(q, k, v, scale, bool(is_causal), 0, False, None)
    return out.reshape(batch_shape + out.shape[1:])
