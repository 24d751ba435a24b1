"""ta.attention_kvcache: decode and prefill against a KV cache, contiguous or paged
(flash_attn_with_kvcache's meaning).

q (B, Hq, Nq, D); k_cache/v_cache (B, Nmax, Hkv, D), or with block_table (B, pages) int32 a paged
cache (num_pages, page_size, Hkv, D) whose row b's key j lives in page block_table[b, j // page_size]
at slot j % page_size. cache_seqlens (B,) int32 (or an int for every row) is each row's length
before the call; k_new/v_new (B, Hkv, Nq_new, D) are first written into the cache in place at
positions cache_seqlens[b] ... (through the table when paged) and attended to. Row b then has
Nk_b = cache_seqlens[b] + Nq_new keys, aligned bottom-right (causal: the Nq queries are the last
Nq positions). cache_seqlens is not updated (as flash-attn). Inference only: no gradient.

The kernels are the dense forward and split-KV decode with SEQ_K (per-row key lengths) and PAGED
(keys gathered through the table, page by page within a key tile) on: short queries (decode) split
each row's keys over programs and pack the GQA group into the tile's rows as plain decode does.
Values (cache_seqlens, block_table) are checked on the host (a read-back: a device sync, several
times a short decode step's time) whenever those tensors are new or were modified since their last
check (torch's version counters); never under CUDA-graph capture or torch.compile tracing, nor with
TILED_ATTN_CHECK_VALUES=0. The kernels clamp every index into the cache, so an unchecked bad value
reads a wrong key, never out of bounds.
"""
from __future__ import annotations

import os
import weakref

import torch

from . import _checks, _mods, _plan, reference
from .attention import AttentionPlan, _backend_for
from .varlen import _host_checks_possible

__all__ = ["attention_kvcache"]

_PLANS = _plan.PlanCache("attention kvcache")
_CHECKED: dict = {}
_CHECK_VALUES = os.environ.get("TILED_ATTN_CHECK_VALUES", "1") != "0"


def _stamp(t):
    """A small int tensor's state without reading it: its version counter (identity is checked
    through weak references: a freed tensor's block comes back to the next tensor of its size)."""
    return None if t is None else (t._version, t.device)


def _same_as_last(seen, cache_seqlens, block_table) -> bool:
    """These tensors, unmodified, passed with these bounds before (by weak reference)."""
    last = _CHECKED.get((id(cache_seqlens), id(block_table)))
    if last is None or last[0] != seen or last[1]() is not cache_seqlens:
        return False
    return block_table is None or (last[2] is not None and last[2]() is block_table)


def _check_int_tensor(name: str, t, shape: tuple, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {_checks._dtype_name(t.dtype)}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")


def _validate(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, scale, backend):
    _checks.check_tensor("q", q, ndim=4, layout_hint="(B, Hq, Nq, D)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _checks.check_tensor(name, t, ndim=4, layout_hint="(B, Nmax, Hkv, D) or paged (pages, page_size, Hkv, D)")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    b = q.shape[0]
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if k_new is not None:
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            _checks.check_tensor(name, t, ndim=4, layout_hint="(B, Hkv, Nq_new, D)")
        want = (b, k_cache.shape[2], k_new.shape[2], k_cache.shape[3])
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if tuple(t.shape) != want:
                raise ValueError(f"{name} must have shape (B, Hkv, Nq_new, D) = {want}, got {tuple(t.shape)}")
            if t.dtype != k_cache.dtype or t.device != k_cache.device:
                raise TypeError(f"{name} must have the cache's dtype and device ({k_cache.dtype}, "
                                f"{k_cache.device}), got ({t.dtype}, {t.device})")
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
            raise ValueError("block_table must be an int32 tensor of shape (B, pages)")
        _check_int_tensor("block_table", block_table, (b, block_table.shape[1]), q.device)
        capacity = k_cache.shape[1] * block_table.shape[1]
    else:
        if k_cache.shape[0] != b:
            raise ValueError(f"k_cache must have q's batch size {b} (or pass block_table for a paged "
                             f"cache), got shape {tuple(k_cache.shape)}")
        capacity = k_cache.shape[1]
    # The heads/dims/dtype/device rules of ta.attention, on the (B, Hkv, N, D) views.
    k4, v4 = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    probe_k = k4 if block_table is None else k4[:1].expand(b, -1, -1, -1)
    _checks.check_attention(q, probe_k, v4 if block_table is None else probe_k, scale, backend)
    if backend == "cuda":
        raise ValueError("backend='cuda' has no KV-cache kernels: use backend=None or backend='triton'")
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise TypeError(f"cache_seqlens must be an int32 tensor (B,) or an int, got {type(cache_seqlens).__name__}")
    given_int = cache_seqlens if isinstance(cache_seqlens, int) else None
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens <= capacity:
            raise ValueError(f"cache_seqlens must be in [0, {capacity}], got {cache_seqlens}")
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    _check_int_tensor("cache_seqlens", cache_seqlens, (b,), q.device)
    n_new = 0 if k_new is None else k_new.shape[2]
    # Reading cache_seqlens/block_table back is a device sync (~60-90 µs on the H100, several times
    # a 4k-key decode step): skipped when the same tensors, unmodified since (torch's version
    # counters), passed with the same bounds; TILED_ATTN_CHECK_VALUES=0 skips it always. The
    # kernels clamp every index into the cache, so an unchecked bad value reads a wrong key,
    # never out of bounds.
    seen = (given_int if given_int is not None else _stamp(cache_seqlens), _stamp(block_table),
            tuple(k_cache.shape), n_new, capacity)
    if _CHECK_VALUES and _host_checks_possible(q) and not _same_as_last(seen, cache_seqlens, block_table):
        lens = [given_int] * b if given_int is not None else cache_seqlens.tolist()  # an int: no read-back
        if any(n < 0 for n in lens):
            raise ValueError(f"cache_seqlens must be >= 0, got {lens}")
        if any(n + n_new > capacity for n in lens):
            raise ValueError(f"cache_seqlens + Nq_new ({n_new}) must be <= the cache's capacity {capacity}, "
                             f"got {lens}")
        if block_table is not None:
            page = k_cache.shape[1]
            rows = block_table.tolist()
            for r, (row, n) in enumerate(zip(rows, lens)):
                used = row[:-(-(n + n_new) // page)]
                if any(not 0 <= p < k_cache.shape[0] for p in used):
                    raise ValueError(f"block_table[{r}] has page indices outside [0, {k_cache.shape[0]}) "
                                     f"among the {len(used)} pages its {n + n_new} keys use: {used}")
        if len(_CHECKED) >= 256:
            del _CHECKED[next(iter(_CHECKED))]
        _CHECKED[(id(cache_seqlens), id(block_table))] = (
            seen, weakref.ref(cache_seqlens), None if block_table is None else weakref.ref(block_table))
    return cache_seqlens, n_new


def _append(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table) -> None:
    """Write k_new/v_new (B, Hkv, Nq_new, D) at positions cache_seqlens[b] + t, in place."""
    b, n_new = k_new.shape[0], k_new.shape[2]
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
    # Clamped into the cache like the kernels' reads: an unchecked bad length (graph capture,
    # torch.compile, TILED_ATTN_CHECK_VALUES=0) writes a wrong slot, never out of bounds.
    pos = (cache_seqlens.long()[:, None] + torch.arange(n_new, device=k_new.device)[None, :]).clamp(0, capacity - 1)
    rows = torch.arange(b, device=k_new.device)[:, None].expand(b, n_new)
    if block_table is None:
        index = (rows, pos)
    else:
        page = k_cache.shape[1]
        index = (block_table.long()[rows, pos // page].clamp(0, k_cache.shape[0] - 1), pos % page)
    k_cache.index_put_(index, k_new.transpose(1, 2))
    v_cache.index_put_(index, v_new.transpose(1, 2))


@torch.compiler.disable  # host value checks and plan lookups: eager (a graph break)
def attention_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, block_table=None,
                      causal: bool = False, scale: float | None = None, window=None, softcap=None,
                      alibi_slopes=None, return_lse: bool = False, backend: str | None = None):
    """Attention of q against a KV cache (see the module doc). Returns out (B, Hq, Nq, D), and lse
    (B, Hq, Nq) float32 with return_lse. backend None: "triton" on CUDA, "torch" on the CPU."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    cache_seqlens, n_new = _validate(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, scale,
                                     backend)
    tensors = [t for t in (q, k_cache, v_cache, k_new, v_new) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError("attention_kvcache is inference only: its inputs must not require grad "
                         "(use torch.no_grad(), or ta.attention for training)")
    b = q.shape[0]
    paged = None
    if block_table is not None:
        paged = (k_cache.shape[1], k_cache.shape[0], block_table.stride(0), block_table.shape[1])
    mods = _mods.make(window, softcap, alibi_slopes, q, b, seq_k=True, paged=paged)
    if k_new is not None:
        _append(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table)
    seq_k = cache_seqlens + n_new if n_new else cache_seqlens
    k4, v4 = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    key = (q.shape, q.stride(), k4.shape, k4.stride(), v4.stride(), q.dtype, q.device, scale, type(scale),
           causal, backend, mods)
    plan = _PLANS.get(key)
    if plan is None:
        scale_v = 1.0 / q.shape[-1] ** 0.5 if scale is None else float(scale)
        be = _backend_for(q, q, causal, 0, True, backend, mods)
        plan = _PLANS.put(key, (scale_v, be, None if be == "torch" else
                                AttentionPlan(q, k4, v4, scale_v, causal, 0, be, mods)))
    scale_v, be, attn = plan
    if attn is None:  # the torch backend: the reference's tiled algorithm per row
        kw = _mods.reference_kwargs(mods._replace(seq_k=False, paged=None), alibi_slopes, None)
        out, lse = reference.attention_kvcache(q, k_cache, v_cache, seq_k, block_table=block_table, causal=causal,
                                               scale=scale_v, return_lse=True, blockwise=True, **kw)
    else:
        out, lse = attn.forward(q, k4, v4, alibi_slopes, None, None, None, seq_k, block_table)
    return (out, lse) if return_lse else out
