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
each row's keys over programs and pack the GQA group into the tile's rows as plain decode does; a
short split of a paged cache reads its block-table entries in one load at its start. A call
without return_lse allocates and writes no lse.
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
    """These tensors (cache_seqlens None: an int), unmodified, passed with these bounds before (by
    weak reference)."""
    last = _CHECKED.get((id(cache_seqlens), id(block_table)))
    if last is None or last[0] != seen:
        return False
    return all(ref is None if t is None else (ref is not None and ref() is t)
               for t, ref in ((cache_seqlens, last[1]), (block_table, last[2])))


def _check_int_tensor(name: str, t, shape: tuple, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {_checks._dtype_name(t.dtype)}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")


def _tensor_sig(t):
    """What validation reads of an optional tensor argument (a non-tensor: itself, so a bad value
    keys its own plan-cache miss, where validation names it; unhashable ones miss every time)."""
    if isinstance(t, torch.Tensor):
        return (t.shape, t.stride(), t.dtype, t.device)
    return (type(t), t)


def _validate(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, scale, backend):
    """Everything a call's signature decides (DESIGN §5): run once per plan. Returns
    (n_new, capacity)."""
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
    if isinstance(cache_seqlens, torch.Tensor):
        _check_int_tensor("cache_seqlens", cache_seqlens, (b,), q.device)
    return (0 if k_new is None else k_new.shape[2]), capacity


def _check_values(plan, cache_seqlens, block_table, given_int) -> None:
    """cache_seqlens within the cache after the append, and the block table's used entries within
    the pool. Reading them back is a device sync (~60-90 µs on the H100, several times a 4k-key
    decode step): skipped when the same tensors, unmodified since (torch's version counters), passed
    with the same bounds; TILED_ATTN_CHECK_VALUES=0 skips it always. The kernels clamp every index
    into the cache, so an unchecked bad value reads a wrong key, never out of bounds."""
    n_new, capacity = plan.n_new, plan.capacity
    if given_int is not None:  # an int: checked here, no read-back
        if not 0 <= given_int <= capacity:
            raise ValueError(f"cache_seqlens must be in [0, {capacity}], got {given_int}")
        if given_int + n_new > capacity:
            raise ValueError(f"cache_seqlens + Nq_new ({n_new}) must be <= the cache's capacity {capacity}, "
                             f"got {given_int}")
        if block_table is None:
            return
    seen = (given_int if given_int is not None else _stamp(cache_seqlens), _stamp(block_table), plan.bounds)
    if not _CHECK_VALUES or not _host_checks_possible(block_table if cache_seqlens is None else cache_seqlens) \
            or _same_as_last(seen, cache_seqlens, block_table):
        return
    lens = [given_int] * plan.batch if given_int is not None else cache_seqlens.tolist()
    if any(n < 0 for n in lens):
        raise ValueError(f"cache_seqlens must be >= 0, got {lens}")
    if any(n + n_new > capacity for n in lens):
        raise ValueError(f"cache_seqlens + Nq_new ({n_new}) must be <= the cache's capacity {capacity}, "
                         f"got {lens}")
    if block_table is not None:
        page, n_pages = plan.page, plan.n_pages
        for r, (row, n) in enumerate(zip(block_table.tolist(), lens)):
            used = row[:-(-(n + n_new) // page)]
            if any(not 0 <= p < n_pages for p in used):
                raise ValueError(f"block_table[{r}] has page indices outside [0, {n_pages}) "
                                 f"among the {len(used)} pages its {n + n_new} keys use: {used}")
    if len(_CHECKED) >= 256:
        del _CHECKED[next(iter(_CHECKED))]
    _CHECKED[(id(cache_seqlens), id(block_table))] = (
        seen, None if cache_seqlens is None else weakref.ref(cache_seqlens),
        None if block_table is None else weakref.ref(block_table))


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


class _KvPlan:
    """A validated signature of attention_kvcache: the attention plan and what the per-call value
    checks and the append need."""

    __slots__ = ("scale", "backend", "attn", "mods", "n_new", "capacity", "page", "n_pages", "batch",
                 "bounds", "copy_lens", "copy_table")

    def __init__(self, q, k_cache, v_cache, cache_seqlens, k_new, block_table, causal, scale, window, softcap,
                 alibi_slopes, backend, n_new, capacity, return_lse):
        b = q.shape[0]
        self.n_new, self.capacity, self.batch = n_new, capacity, b
        self.page, self.n_pages = k_cache.shape[1], k_cache.shape[0]
        self.bounds = (tuple(k_cache.shape), n_new, capacity)
        # The kernels read cache_seqlens[b] and block_table[b, p] at unit stride along b and p
        # (and the table's row stride from the plan): other layouts are copied once per call.
        self.copy_lens = isinstance(cache_seqlens, torch.Tensor) and b > 1 and cache_seqlens.stride(0) != 1
        self.copy_table = block_table is not None and block_table.shape[1] > 1 and block_table.stride(1) != 1
        paged = None
        if block_table is not None:
            table_stride = block_table.shape[1] if self.copy_table else block_table.stride(0)
            paged = (k_cache.shape[1], k_cache.shape[0], table_stride, block_table.shape[1])
        self.mods = _mods.make(window, softcap, alibi_slopes, q, b, seq_k=True, paged=paged)
        self.scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else float(scale)
        self.backend = _backend_for(q, q, causal, 0, True, backend, self.mods)
        self.attn = None
        if self.backend != "torch":  # the torch backend runs the reference per call
            k4, v4 = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
            # No lse asked: none allocated or written (an inference call's host time is mostly
            # such steps, DESIGN §3).
            self.attn = AttentionPlan(q, k4, v4, self.scale, causal, 0, self.backend, self.mods,
                                      store_lse=return_lse)


def _signature(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window, softcap,
               alibi_slopes, backend, return_lse) -> tuple:
    """Everything _validate and the plan read (a value check aside): equal signatures, equal plans."""
    return (q.shape, q.stride(), q.dtype, q.device, _tensor_sig(k_cache), _tensor_sig(v_cache),
            None if k_new is None else _tensor_sig(k_new), None if v_new is None else _tensor_sig(v_new),
            None if block_table is None else _tensor_sig(block_table),
            int if type(cache_seqlens) is int else _tensor_sig(cache_seqlens),
            causal, type(causal), scale, type(scale), window, softcap, type(softcap),
            None if alibi_slopes is None else _tensor_sig(alibi_slopes), backend, bool(return_lse))


@_plan.eager_only  # host value checks and plan lookups: eager (a graph break)
def attention_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, block_table=None,
                      causal: bool = False, scale: float | None = None, window=None, softcap=None,
                      alibi_slopes=None, return_lse: bool = False, backend: str | None = None):
    """Attention of q against a KV cache (see the module doc). Returns out (B, Hq, Nq, D), and lse
    (B, Hq, Nq) float32 with return_lse. backend None: "triton" on CUDA, "torch" on the CPU.

    A call: its signature's plan (a miss validates everything but the values, DESIGN §5, and
    plans) → the value check (cached by tensor version) → the append → the kernels."""
    try:
        key = _signature(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window,
                         softcap, alibi_slopes, backend, return_lse)
        plan = _PLANS.get(key)
    except (TypeError, AttributeError):  # a non-tensor or unhashable argument: validation names it
        key = plan = None
    if plan is None:
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        n_new, capacity = _validate(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, scale, backend)
        plan = _PLANS.put(key, _KvPlan(q, k_cache, v_cache, cache_seqlens, k_new, block_table, causal, scale,
                                       window, softcap, alibi_slopes, backend, n_new, capacity, bool(return_lse)))
    if torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad or
                                    (k_new is not None and (k_new.requires_grad or v_new.requires_grad))):
        raise ValueError("attention_kvcache is inference only: its inputs must not require grad "
                         "(use torch.no_grad(), or ta.attention for training)")
    given_int = None
    if type(cache_seqlens) is int:
        given_int = cache_seqlens
        _check_values(plan, None, block_table, given_int)
        cache_seqlens = torch.full((plan.batch,), given_int, dtype=torch.int32, device=q.device)
    else:
        _check_values(plan, cache_seqlens, block_table, None)
        if plan.copy_lens:
            cache_seqlens = cache_seqlens.contiguous()
    if plan.copy_table:
        block_table = block_table.contiguous()
    n_new = plan.n_new
    if n_new:
        _append(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table)
        seq_k = cache_seqlens + n_new
    else:
        seq_k = cache_seqlens
    if plan.attn is None:  # the torch backend: the reference's tiled algorithm per row
        mods = plan.mods
        kw = _mods.reference_kwargs(mods._replace(seq_k=False, paged=None), alibi_slopes, None)
        out, lse = reference.attention_kvcache(q, k_cache, v_cache, seq_k, block_table=block_table, causal=causal,
                                               scale=plan.scale, return_lse=True, blockwise=True, **kw)
    else:
        # The Triton launches read the caches' data pointers only (the (B, Hkv, N, D) strides are
        # the plan's): no transposed views per call.
        out, lse = plan.attn.forward(q, k_cache, v_cache, alibi_slopes, None, None, None, seq_k, block_table)
    return (out, lse) if return_lse else out
