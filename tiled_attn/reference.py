"""Pure-PyTorch algorithms: the reference every kernel is checked against, and the "torch" backend.

Everything here is written for clarity and works in float64. The online-softmax state of DESIGN §1
lives in `OnlineState` with the verbs `update`, `merge` and `finalize`; the tiled softmax and the
blockwise attention below are loops that call them, exactly like the Triton and CUDA kernels do.

State convention: `m` is the running max and `l` the sum of `exp(x - m)`, both in natural units.
A state that has seen only `-inf` has `m = -inf, l = 0`; every verb guards `exp(-inf - (-inf))` by
treating such a max as 0 (the FlashAttention trick), so merging or updating it never makes a NaN.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "OnlineState",
    "identity_state",
    "tile_state",
    "update",
    "merge_states",
    "finalize",
    "safe_softmax",
    "online_softmax",
    "tiled_softmax",
    "softmax_backward",
    "attention",
    "blockwise_attention",
    "merge_attention_partials",
    "attention_probs",
    "blockwise_attention_backward",
]

NEG_INF = float("-inf")


class OnlineState(NamedTuple):
    m: torch.Tensor  # running max, shape (..., 1) so it broadcasts against a tile
    l: torch.Tensor  # running sum of exp(x - m)


def _finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    # A max of -inf means every value seen so far is -inf: shift by 0 instead, so exp(-inf - 0) = 0
    # rather than exp(-inf - (-inf)) = NaN.
    return torch.where(m == NEG_INF, torch.zeros_like(m), m)


def identity_state(shape, dtype=torch.float32, device=None) -> OnlineState:
    """The state of an empty row: merging it with any state S gives S."""
    return OnlineState(torch.full(shape, NEG_INF, dtype=dtype, device=device),
                       torch.zeros(shape, dtype=dtype, device=device))


def _sum_exp(x: torch.Tensor, m: torch.Tensor, e: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ e where e = exp(x − m) and m = max(x): the terms at a finite max, exactly 1 each, are
    counted and added after the rest. The sum's rounding is then relative to what lies below the
    max, so the large outputs of a peaked row, which a rounded sum moves most, see almost none of
    it. (On the H100, float64, a 3000-column row at scale 10: e.sum() left 4 ulps on a 0.91 output
    where torch.softmax happened to be exact.)"""
    at_max = (x == m) & torch.isfinite(m)
    rest = torch.where(at_max, torch.zeros_like(e), e).sum(dim=dim, keepdim=True)
    return rest + at_max.sum(dim=dim, keepdim=True).to(e.dtype)


def tile_state(tile: torch.Tensor, dim: int = -1) -> OnlineState:
    """State of one tile on its own: m = max(t), l = sum(exp(t - m))."""
    m = tile.amax(dim=dim, keepdim=True)
    return OnlineState(m, _sum_exp(tile, m, torch.exp(tile - _finite_or_zero(m)), dim))


def update(state: OnlineState, tile: torch.Tensor, dim: int = -1) -> OnlineState:
    """m' = max(m, max(t)),  l' = l·exp(m − m') + Σ exp(t − m')."""
    m_new = torch.maximum(state.m, tile.amax(dim=dim, keepdim=True))
    shift = _finite_or_zero(m_new)
    l_new = state.l * torch.exp(state.m - shift) + torch.exp(tile - shift).sum(dim=dim, keepdim=True)
    return OnlineState(m_new, l_new)


def merge_states(a: OnlineState, b: OnlineState) -> OnlineState:
    """m = max(m1, m2),  l = l1·exp(m1 − m) + l2·exp(m2 − m)."""
    m = torch.maximum(a.m, b.m)
    shift = _finite_or_zero(m)
    return OnlineState(m, a.l * torch.exp(a.m - shift) + b.l * torch.exp(b.m - shift))


def finalize(x: torch.Tensor, state: OnlineState) -> torch.Tensor:
    """y = exp(x − m) / l. A row of only -inf gives 0/0 = NaN, as torch.softmax does."""
    return torch.exp(x - _finite_or_zero(state.m)) / state.l


def attention_probs(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """finalize from a finished state: p = exp(s − m)/l = exp(s − lse) with lse = m + log l (the
    attention backward recomputes P this way from the forward's saved lse). A row that saw no key
    (lse = −inf) gives p = 0, not exp(s + inf)."""
    return torch.exp(s - torch.where(lse == NEG_INF, torch.full_like(lse, math.inf), lse)[..., None])


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------------------------
# softmax
# ----------------------------------------------------------------------------------------------
def safe_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The classic three passes: max, then sum of exp(x - max), then divide."""
    xa = x.to(_acc_dtype(x.dtype))
    m = xa.amax(dim=dim, keepdim=True)
    e = torch.exp(xa - m)
    return (e / _sum_exp(xa, m, e, dim)).to(x.dtype)


def online_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The element-wise recurrence of the seeds, one column at a time (slow: for tests only).

    Accumulates in float64 whatever the input: folding N columns one by one into a running sum
    rounds N times (an O(N·eps) error, not the O(log N·eps) of a tree sum), which in float32 already
    exceeds the numerics rule for rows of a few hundred columns.
    """
    xa = x.to(torch.float64).movedim(dim, -1)
    state = identity_state(xa.shape[:-1] + (1,), xa.dtype, xa.device)
    for j in range(xa.shape[-1]):
        state = update(state, xa[..., j:j + 1])
    return finalize(xa, state).movedim(-1, dim).to(x.dtype)


def tiled_softmax(x: torch.Tensor, dim: int = -1, tile: int = 1 << 16) -> torch.Tensor:
    """The torch backend: one state per tile of `tile` columns, merged, then one normalize pass.

    Accumulates in float32 (float64 for float64 input); output in the input dtype.
    """
    if x.numel() == 0:
        return torch.empty_like(x)
    xa = x.movedim(dim, -1)
    n = xa.shape[-1]
    acc = _acc_dtype(x.dtype)
    state = identity_state(xa.shape[:-1] + (1,), acc, x.device)
    for start in range(0, n, tile):
        state = merge_states(state, tile_state(xa[..., start:start + tile].to(acc)))
    y = torch.empty(xa.shape, dtype=x.dtype, device=x.device)
    for start in range(0, n, tile):
        y[..., start:start + tile] = finalize(xa[..., start:start + tile].to(acc), state)
    return y.movedim(-1, dim)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """dx = y·(dy − Σ dy·y), accumulated in float32 (float64 for float64)."""
    acc = _acc_dtype(y.dtype)
    ya, dya = y.to(acc), dy.to(acc)
    return (ya * (dya - (dya * ya).sum(dim=dim, keepdim=True))).to(y.dtype)


# ----------------------------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------------------------
def _causal_mask(nq: int, nk: int, device, offset: int | None = None) -> torch.Tensor:
    """Query i sees key j iff j <= i + offset. The default offset nk - nq is bottom-right alignment,
    like flash-attn >= 2.1; offset 0 is torch SDPA's top-left `is_causal`."""
    offset = nk - nq if offset is None else offset
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + offset


def _expand_kv(k: torch.Tensor, hq: int) -> torch.Tensor:
    # The reference may repeat K/V for GQA; the kernels map heads by index instead.
    return k.repeat_interleave(hq // k.shape[1], dim=1) if k.shape[1] != hq else k


def attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False,
              causal_offset: int | None = None):
    """softmax(q kᵀ · scale) v, materializing the scores: the reference (use float64 inputs).

    Causal masking is bottom-right aligned unless `causal_offset` says otherwise (see _causal_mask).
    Fully masked rows (causal with nq > nk) give output 0 and lse -inf.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~_causal_mask(q.shape[2], k.shape[2], q.device, causal_offset), NEG_INF)
    lse = torch.logsumexp(s, dim=-1) if s.shape[-1] > 0 else torch.full(s.shape[:-1], NEG_INF,
                                                                         dtype=s.dtype, device=s.device)
    p = torch.exp(s - _finite_or_zero(lse)[..., None])
    out = torch.matmul(p, v)
    return (out, lse) if return_lse else out


def _attention_block_loop(q, k, v, causal, scale, kv_start, kv_stop, offset, block_n):
    """Online attention over keys [kv_start, kv_stop): returns the unnormalized (acc, state)."""
    b, h, nq, _ = q.shape
    acc_t = _acc_dtype(q.dtype)
    qa = q.to(acc_t)
    state = identity_state((b, h, nq, 1), acc_t, q.device)
    acc = torch.zeros(b, h, nq, v.shape[-1], dtype=acc_t, device=q.device)
    rows = torch.arange(nq, device=q.device)[:, None]
    for start in range(kv_start, kv_stop, block_n):
        stop = min(start + block_n, kv_stop)
        s = torch.matmul(qa, k[:, :, start:stop].to(acc_t).transpose(-1, -2)) * scale
        if causal:
            cols = torch.arange(start, stop, device=q.device)[None, :]
            s = s.masked_fill(cols > rows + offset, NEG_INF)
        new = update(state, s)
        shift = _finite_or_zero(new.m)
        # The accumulator is rescaled by the same exp(m - m') factor as l.
        acc = acc * torch.exp(state.m - shift) + torch.matmul(torch.exp(s - shift), v[:, :, start:stop].to(acc_t))
        state = new
    return acc, state


def _finalize_attention(acc, state: OnlineState, dtype):
    empty = state.l == 0  # fully masked row (or no keys): output 0, lse -inf
    out = torch.where(empty, torch.zeros_like(acc), acc / torch.where(empty, torch.ones_like(state.l), state.l))
    lse = torch.where(empty, torch.full_like(state.m, NEG_INF), state.m + torch.log(state.l))
    return out.to(dtype), lse.squeeze(-1).to(_acc_dtype(dtype))


def merge_attention_partials(parts):
    """Merge (acc, state) partials of disjoint key ranges (split-KV / flash-decoding)."""
    acc, state = parts[0]
    for acc2, state2 in parts[1:]:
        merged = merge_states(state, state2)
        shift = _finite_or_zero(merged.m)
        acc = acc * torch.exp(state.m - shift) + acc2 * torch.exp(state2.m - shift)
        state = merged
    return acc, state


def blockwise_attention(q, k, v, causal: bool = False, scale: float | None = None,
                        return_lse: bool = False, block_n: int = 512, num_splits: int = 1,
                        causal_offset: int | None = None):
    """The torch backend of ta.attention: online softmax over key blocks, never the full scores.

    With num_splits > 1 the keys are split into ranges whose partial (acc, m, l) are merged, the
    same split-KV scheme the decode kernels use. Accumulates in float32 (float64 for float64).
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nk = k.shape[2]
    offset = nk - q.shape[2] if causal_offset is None else causal_offset
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    num_splits = max(1, min(num_splits, nk))
    bounds = [nk * i // num_splits for i in range(num_splits + 1)]
    parts = [_attention_block_loop(q, k, v, causal, scale, bounds[i], bounds[i + 1], offset, block_n)
             for i in range(num_splits)]
    out, lse = _finalize_attention(*merge_attention_partials(parts), q.dtype)
    return (out, lse) if return_lse else out


def _sum_group(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, ...) -> (B, Hkv, ...): the sum over each key/value head's group of query heads."""
    b, hq = x.shape[:2]
    return x.reshape(b, hkv, hq // hkv, *x.shape[2:]).sum(2) if hq != hkv else x


def blockwise_attention_backward(q, k, v, out, lse, grad_out, grad_lse=None, causal: bool = False,
                                 scale: float | None = None, causal_offset: int | None = None,
                                 block_n: int = 512):
    """The torch backend's attention backward, the tiled algorithm of the kernels: (dq, dk, dv).

    delta = rowsum(dO·O) − dlse first; then per key block P = exp(s − lse) is recomputed from q, k
    and the forward's lse (never the full scores), dV += Pᵀ·dO, dS = P·(dO·Vᵀ − delta),
    dQ += dS·K·scale, dK += dSᵀ·Q·scale, with dK/dV summed over each GQA group. (A gradient of lse
    adds P·dlse to dS: d lse_i / d s_ij = P_ij, hence the − dlse in delta.) Accumulates in float32
    (float64 for float64); the gradients come back in the inputs' dtypes.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    b, hq, nq, _ = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    offset = nk - nq if causal_offset is None else causal_offset
    acc_t = _acc_dtype(q.dtype)
    qa, doa = q.to(acc_t), grad_out.to(acc_t)
    delta = (doa * out.to(acc_t)).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.to(acc_t)
    lse_a = lse.to(acc_t)
    dq = torch.zeros(b, hq, nq, d, dtype=acc_t, device=q.device)
    dk = torch.zeros(b, hkv, nk, d, dtype=acc_t, device=q.device)
    dv = torch.zeros(b, hkv, nk, v.shape[-1], dtype=acc_t, device=q.device)
    rows = torch.arange(nq, device=q.device)[:, None]
    for start in range(0, nk, block_n):
        stop = min(start + block_n, nk)
        kb = _expand_kv(k[:, :, start:stop].to(acc_t), hq)
        vb = _expand_kv(v[:, :, start:stop].to(acc_t), hq)
        s = torch.matmul(qa, kb.transpose(-1, -2)) * scale
        if causal:
            cols = torch.arange(start, stop, device=q.device)[None, :]
            s = s.masked_fill(cols > rows + offset, NEG_INF)
        p = attention_probs(s, lse_a)
        ds = p * (torch.matmul(doa, vb.transpose(-1, -2)) - delta[..., None])
        dv[:, :, start:stop] = _sum_group(torch.matmul(p.transpose(-1, -2), doa), hkv)
        dk[:, :, start:stop] = _sum_group(torch.matmul(ds.transpose(-1, -2), qa), hkv) * scale
        dq += torch.matmul(ds, kb) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
