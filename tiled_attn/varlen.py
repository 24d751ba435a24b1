"""ta.attention_varlen: packed sequences of different lengths (flash_attn_varlen_func's meaning).

q (total_q, Hq, D), k/v (total_k, Hkv, D); sequence b is q rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
against k/v rows cu_seqlens_k[b]:cu_seqlens_k[b+1], aligned bottom-right per sequence (its Nk − Nq),
with everything ta.attention takes (causal, window, softcap, ALiBi). Output (total_q, Hq, D),
lse (Hq, total_q) float32 (flash-attn's layout).

The Triton kernel is the dense forward with VARLEN on (attention_fwd.fwd_program): one program per
(sequence, head, query tile of the longest sequence); a tile past its sequence's end visits no key,
so a batch costs its valid pairs plus those idle programs. The (1, H, total, D) views are the
tensors as they are: nothing is padded, copied or gathered.

Values (cu_seqlens, max_seqlen) are checked on the host, one small device-to-host copy, whenever
the cu_seqlens tensor is new or was modified since its last check (torch's version counter), except
while a CUDA graph is being captured or torch.compile traces (a copy cannot happen there); the
kernels clamp every sequence into the tensors (a wrong table gives a wrong answer, never an
out-of-bounds read).
"""
from __future__ import annotations

import weakref

import torch

from . import _checks, _mods, _plan, reference
from .attention import _Attention, _grad_needed, _plan_for, _resolve
from .attention import attention as _dense_attention

__all__ = ["attention_varlen"]


def _host_checks_possible(t: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def check_cu_seqlens(name: str, cu: torch.Tensor, total: int, max_seqlen, max_name: str) -> bool:
    """cu_seqlens: int32, 1-D, (B+1,), from 0, non-decreasing, ending within the tensor; every
    sequence no longer than max_seqlen. Returns whether the values were read (now or for this
    tensor version before) and every sequence is exactly max_seqlen >= 1 rows, ending at the
    tensor's last row: the packed tensor is then a (B, max_seqlen) batch."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be an int32 tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {_checks._dtype_name(cu.dtype)}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(cu.shape)}")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise TypeError(f"{max_name} must be a non-negative int, got {max_seqlen!r}")
    if not _host_checks_possible(cu):
        return False
    # A read-back is a device sync (on the H100 it cost varlen's eager calls 10-25%: the GPU idles
    # while the host waits): the same tensor, unmodified since (its version counter), with the
    # same bounds was checked already. A tensor written behind torch's back keeps its version;
    # the kernels clamp every sequence into the tensors, so such a value is wrong, never unsafe.
    # Identity through a weak reference: a freed tensor's block comes back from the caching
    # allocator to the next one of its size, at version 0, so an address alone is not identity.
    seen = (name, cu._version, total, max_seqlen)
    last = _CHECKED.get((id(cu), name))
    if last is not None and last[0]() is cu and last[1] == seen:
        return last[2]
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    if values[-1] > total:
        raise ValueError(f"{name} ends at {values[-1]}, past the tensor's {total} rows")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(f"{max_name} = {max_seqlen} is smaller than a sequence of {max(lengths)} "
                         f"rows in {name}")
    uniform = bool(lengths) and max_seqlen >= 1 and values[-1] == total and all(n == max_seqlen for n in lengths)
    if len(_CHECKED) >= 256:  # the oldest go first (a training loop makes a new tensor per batch)
        del _CHECKED[next(iter(_CHECKED))]
    _CHECKED[(id(cu), name)] = (weakref.ref(cu), seen, uniform)  # one tensor may serve as both q's and k's
    return uniform


# cu_seqlens tensors that passed, by (id, which): (weak ref, (which, version, bounds), uniform). A model
# calls varlen once per layer with the same tensors, and a benchmark rotates a few: each is read back once.
_CHECKED: dict = {}


def _sig(t):
    """What validation reads of an argument: a tensor's layout, or a non-tensor itself (a bad one
    keys its own miss, where validation names it; an unhashable one misses every time)."""
    if isinstance(t, torch.Tensor):
        return (t.shape, t.stride(), t.dtype, t.device)
    return (type(t), t)


def _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, softcap,
              alibi_slopes, deterministic, backend):
    """Everything but cu_seqlens' values (DESIGN §5), once per signature: (scale, backend, mods,
    whether cu_seqlens_q / cu_seqlens_k need a unit-stride copy for the kernels)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.check_tensor(name, t, ndim=3, layout_hint="(total, H, D)")
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    _checks.check_attention(q4, k4, v4, scale, backend)
    if deterministic is not False and deterministic is not True:
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q")
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {cu.device}")
    batch = cu_seqlens_q.shape[0] - 1
    mods = _mods.make(window, softcap, alibi_slopes, q4, batch,
                      varlen=(batch, int(max_seqlen_q), int(max_seqlen_k)))
    scale_v, backend = _resolve(q4, k4, v4, scale, causal, 0, True, backend, mods)
    # The kernels read cu_seqlens[b] at unit stride: another layout is copied per call.
    copies = tuple(cu.shape[0] > 1 and cu.stride(0) != 1 for cu in (cu_seqlens_q, cu_seqlens_k))
    return scale_v, backend, mods, copies


_SIGNATURES = _plan.PlanCache("attention varlen")


@_plan.eager_only  # host value checks and plan lookups: eager (a graph break)
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = False, scale: float | None = None, window=None, softcap=None,
                     alibi_slopes=None, return_lse: bool = False, deterministic: bool = False,
                     backend: str | None = None):
    """Attention over packed sequences (see the module doc). Differentiable in q, k and v.

    backend None is "triton" on CUDA and "torch" (tiled_attn.reference, per sequence) on the CPU;
    where every sequence is exactly max_seqlen_q queries and max_seqlen_k keys (the packed tensors
    are a (B, N) batch) the call is ta.attention's on that batch, with the same backend argument
    (None: the dense default, which may be another kernel).
    The Triton backward runs the same packed layout (attention_bwd_ext.py). A call: its signature's
    validation (once: DESIGN §3) → cu_seqlens' values (read back once per tensor and version) →
    the attention plan of the (1, H, total, D) views → the kernels."""
    try:
        key = (_sig(q), _sig(k), _sig(v), _sig(cu_seqlens_q), _sig(cu_seqlens_k), max_seqlen_q,
               type(max_seqlen_q), max_seqlen_k, type(max_seqlen_k), causal, type(causal), scale, type(scale),
               window, softcap, type(softcap), None if alibi_slopes is None else _sig(alibi_slopes),
               deterministic, type(deterministic), backend)
        checked = _SIGNATURES.get(key)
    except (TypeError, AttributeError):
        key = checked = None
    if checked is None:
        checked = _SIGNATURES.put(key, _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                 causal, scale, window, softcap, alibi_slopes, deterministic,
                                                 backend))
    # the values (read back once per tensor and version: validation's reads are found here)
    uniform = (check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q")
               & check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k"))
    scale_v, resolved, mods, (copy_q, copy_k) = checked
    if uniform and resolved != "torch":
        # Every sequence has max_seqlen_q queries and max_seqlen_k keys: the packed tensors are a
        # (B, N) batch, and the dense call computes the same thing (bottom-right aligned per
        # sequence, as here) with its own default's kernel: on the H100 at D = 128 the CUDA one,
        # 12-18% faster there than the varlen kernel (benchmarks/results/…-s19-varlen-kernel.md).
        b = cu_seqlens_q.shape[0] - 1
        q4, k4, v4 = (t.unflatten(0, (b, -1)).transpose(1, 2) for t in (q, k, v))
        res = _dense_attention(q4, k4, v4, causal=causal, scale=scale, window=window, softcap=softcap,
                               alibi_slopes=alibi_slopes, return_lse=return_lse, deterministic=deterministic,
                               backend=backend)
        if not return_lse:
            return res.transpose(1, 2).flatten(0, 1)
        return res[0].transpose(1, 2).flatten(0, 1), res[1].transpose(0, 1).flatten(1)  # lse (Hq, total_q)
    backend = resolved
    if backend == "torch":
        # The reference's tiled algorithm per sequence, differentiated by torch's autograd.
        kw = _mods.reference_kwargs(mods._replace(varlen=None), alibi_slopes, None)
        out, lse = reference.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale_v,
                                              return_lse=True, blockwise=True, **kw)
        return (out, lse) if return_lse else out
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    extras = (alibi_slopes, None, cu_seqlens_q.contiguous() if copy_q else cu_seqlens_q,
              cu_seqlens_k.contiguous() if copy_k else cu_seqlens_k)
    if _grad_needed(q, k, v):
        out4, lse3 = _Attention.apply(q4, k4, v4, scale_v, causal, 0, backend, return_lse, deterministic, mods,
                                      *extras)
    else:
        out4, lse3 = _plan_for(q4, k4, v4, scale_v, causal, 0, True, backend, mods).forward(q4, k4, v4, *extras)
    out, lse = out4[0].transpose(0, 1), lse3[0]
    return (out, lse) if return_lse else out
